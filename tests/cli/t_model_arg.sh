#!/bin/sh
# What MODEL names: a Hugging Face cache snapshot, repo folder or repo id
# (never downloaded; the default output goes to the current directory, named
# after the repo), and files that are not safetensors named for what they are
# (a PyTorch checkpoint by its zip or pickle magic, a JSON file), with what
# to do.
. "$TOP/tests/cli/lib.sh"
L="$TOP/testdata/conformance/llama-tp4-uneven-vocab/model"

# A cache as huggingface_hub lays it out: blobs, refs/main, snapshots of links.
H="$T/hub/models--acme--tiny-llama" REV=0123456789abcdef0123456789abcdef01234567
mkdir -p "$H/blobs" "$H/refs" "$H/snapshots/$REV" "$H/snapshots/fedcba9876543210fedcba9876543210fedcba98" "$T/work"
cp "$L/model.safetensors" "$H/blobs/a1" && cp "$L/config.json" "$H/blobs/b2"
ln -s ../../blobs/a1 "$H/snapshots/$REV/model.safetensors"
ln -s ../../blobs/b2 "$H/snapshots/$REV/config.json"
printf '%s' "$REV" >"$H/refs/main"
S="$H/snapshots/$REV"
cache_clean() { [ "$(ls -A "$S")" = "$(printf 'config.json\nmodel.safetensors')" ] && [ "$(ls -A "$H")" = "$(printf 'blobs\nrefs\nsnapshots')" ]; }
# in_work CMD...: runs CMD in $T/work with the cache as HF_HUB_CACHE.
in_work() { (cd "$T/work" && HF_HUB_CACHE="$T/hub" "$@"); }

rm -rf "$T/work"/*
expect_exit 0 "split of a cache snapshot without -o" -- in_work tps split "$S" --tp 2
[ -f "$T/work/tiny-llama-tp2/tpshard.json" ] && cache_clean &&
  ok "writes tiny-llama-tp2/ in the current directory, nothing into the cache" ||
  { notok "default output of a snapshot"; ls -A "$T/work" "$S" | diag; }
expect_stdout_has "to tiny-llama-tp2 " "says where it wrote"
expect_exit 0 "split of a file in a snapshot without -o" -- in_work tps split "$S/model.safetensors" --tp 4
[ -f "$T/work/tiny-llama-tp4/tpshard.json" ] && cache_clean && ok "writes tiny-llama-tp4/ in the current directory" ||
  notok "default output of a snapshot's file"
rm -rf "$T/work"/*
expect_exit 0 "split of the repo folder (models--acme--tiny-llama) reads refs/main" -- in_work tps split "$H" --tp 2
# The other snapshot is empty: only refs/main's could have been split.
[ -f "$T/work/tiny-llama-tp2/tpshard.json" ] && cache_clean && tps check "$T/work/tiny-llama-tp2" -q &&
  cmp -s "$T/work/tiny-llama-tp2/config.json" "$L/config.json" &&
  ok "refs/main's snapshot was split into tiny-llama-tp2/ in the current directory" || notok "split of the repo folder"
rm -rf "$T/work"/*
expect_exit 0 "split of a repo id found in HF_HUB_CACHE" -- in_work tps split acme/tiny-llama --tp 2
[ -f "$T/work/tiny-llama-tp2/tpshard.json" ] && cache_clean && ok "writes tiny-llama-tp2/ in the current directory" ||
  notok "default output of a repo id"
expect_exit 0 "inspect of a repo id" -- in_work tps inspect acme/tiny-llama
expect_stdout_has "model.embed_tokens.weight" "inspect reads the snapshot"
expect_exit 0 "plan of a repo id" -- in_work tps plan acme/tiny-llama --tp 2
expect_exit 0 "verify --source of a repo id" -- in_work tps verify tiny-llama-tp2 --source acme/tiny-llama
expect_exit 0 "HF_HOME/hub when HF_HUB_CACHE is unset" -- sh -c "cd '$T/work' && mkdir -p h && ln -sfn '$T/hub' h/hub && env -u HF_HUB_CACHE HF_HOME='$T/work/h' '$TPSHARD' inspect acme/tiny-llama -q"
expect_exit 0 "~/.cache/huggingface/hub without HF_HOME" -- sh -c "mkdir -p '$T/home/.cache/huggingface' && ln -sfn '$T/hub' '$T/home/.cache/huggingface/hub' && cd '$T/work' && env -u HF_HUB_CACHE -u HF_HOME -u XDG_CACHE_HOME HOME='$T/home' '$TPSHARD' inspect acme/tiny-llama -q"
# A revision refs/main names but that is not there; a repo id not in the cache.
printf 'deadbeef' >"$H/refs/main"
expect_exit 1 "refs/main naming a revision not downloaded" -- in_work tps inspect acme/tiny-llama
expect_stderr_has "does not download" "says tpshard does not download"
printf '%s' "$REV" >"$H/refs/main"
rm -rf "$T/work"/*
expect_exit 1 "a repo id not in the cache" -- in_work tps split acme/other-model --tp 2
expect_stderr_has "nor a model in the Hugging Face cache ($T/hub)" "says it is not in the cache, naming the cache"
expect_stderr_has "does not download" "says tpshard does not download"
expect_stderr_has "huggingface-cli download acme/other-model" "says how to download it"
[ -z "$(ls -A "$T/work")" ] && ok "nothing written for a repo id not in the cache" || notok "nothing written"
# A path that exists wins over a repo id of the same spelling.
mkdir -p "$T/work/acme" && gen llama "$T/work/acme/tiny-llama" --seed 9 >/dev/null
expect_exit 0 "a directory named like a repo id is the directory" -- in_work tps split acme/tiny-llama --tp 2 -o local
tps merge "$T/work/local" -o "$T/work/merged" -q && cmp -s "$T/work/merged/model.safetensors" "$T/work/acme/tiny-llama/model.safetensors" &&
  ok "the local directory was split, not the cache's model" || notok "the local directory"

# Not safetensors: a PyTorch checkpoint (torch.save's zip archive, or the
# older pickle), by its first bytes whatever its name; a JSON file.
mkdir -p "$T/pt" "$T/pk" "$T/mix"
python3 - "$T" <<'PY'
import pickle, sys, zipfile
t = sys.argv[1]
# torch.save (1.6+): an uncompressed zip of archive/data.pkl, archive/data/0...
with zipfile.ZipFile(t + "/pt/pytorch_model.bin", "w", zipfile.ZIP_STORED) as z:
    z.writestr("archive/data.pkl", pickle.dumps({"w": 1}, protocol=2))
    z.writestr("archive/data/0", b"\0" * 64)
    z.writestr("archive/version", b"3\n")
# torch.save before 1.6: pickles, the first of them its magic number
with open(t + "/pk/weights.pt", "wb") as f:
    f.write(pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + pickle.dumps({"w": 1}, protocol=2))
with open(t + "/mix/pytorch_model-00001-of-00002.bin", "wb") as f:
    f.write(pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2))
PY
cp "$T/pt/pytorch_model.bin" "$T/pt/renamed.safetensors"
for f in "$T/pt/pytorch_model.bin" "$T/pk/weights.pt" "$T/pt/renamed.safetensors"; do
  b=$(basename "$f")
  expect_exit 1 "split of a PyTorch checkpoint ($b) fails" -- tps split "$f" --tp 2
  expect_stderr_has "a PyTorch checkpoint" "$b: says it is a PyTorch checkpoint"
  expect_stderr_has "tpshard reads safetensors only" "$b: says tpshard reads safetensors"
  expect_stderr_has "save_pretrained(" "$b: says how to convert it (transformers)"
  expect_stderr_has "safetensors.torch" "$b: says how to convert it (safetensors.torch.save_file)"
  ! grep -q "header length" "$ERR" && ok "$b: not a header-length complaint" || notok "$b: header length"
done
run tps split "$T/pt/pytorch_model.bin" --tp 2
expect_stderr_has "torch.save zip archive" "a zip archive is named as torch.save's"
run tps split "$T/pk/weights.pt" --tp 2
expect_stderr_has "pickle" "a pickle is named as one"
for d in "$T/pt" "$T/mix"; do
  rm -f "$T/pt/renamed.safetensors"
  expect_exit 1 "a directory holding only a PyTorch checkpoint ($(basename "$d"))" -- tps split "$d" --tp 2
  expect_stderr_has "holds a PyTorch checkpoint" "$(basename "$d"): says it holds a PyTorch checkpoint"
  expect_stderr_has "pytorch_model" "$(basename "$d"): names the file"
  expect_stderr_has "save_pretrained(" "$(basename "$d"): says how to convert it"
done
expect_exit 1 "inspect of such a directory" -- tps inspect "$T/mix"
expect_stderr_has "holds a PyTorch checkpoint" "inspect says so too"
# JSON given as MODEL.
gen llama "$T/ix" --index 2 >/dev/null
for f in "$L/config.json" "$T/ix/model.safetensors.index.json"; do
  b=$(basename "$f")
  expect_exit 1 "split of $b fails" -- tps split "$f" --tp 2
  expect_stderr_has "not a safetensors file; pass the directory instead: $(dirname "$f")" "$b: says to pass the directory"
done
run tps split "$L/config.json" --tp 2
expect_stderr_has "the model's config.json" "config.json is named as the config"
run tps plan "$T/ix/model.safetensors.index.json" --tp 2
expect_stderr_has "the index of a sharded checkpoint" "the index is named as the index"
finish
