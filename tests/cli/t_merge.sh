#!/bin/sh
# merge into an existing directory: every file merge would write (the
# safetensors files, the index, config.json, generation_config.json, the
# tokenizer files) is refused when there, before anything is written, unless
# --force; --force replaces them.
. "$TOP/tests/cli/lib.sh"
gen llama "$T/m" --index 3 --seed 5 >/dev/null
echo '{"bos_token_id": 1}' >"$T/m/generation_config.json"
echo '{"model": {"type": "BPE"}}' >"$T/m/tokenizer.json"
echo '{"model_max_length": 128}' >"$T/m/tokenizer_config.json"
tps split "$T/m" --tp 2 -o "$T/s" -q || notok "split for the merge tests"
parts=$(cd "$T/m" && ls model-*-of-*.safetensors)
for f in config.json generation_config.json tokenizer.json tokenizer_config.json \
  model.safetensors.index.json $parts; do
  rm -rf "$T/out"; mkdir -p "$T/out"
  echo "theirs" >"$T/out/$f"
  expect_exit 1 "merge into a directory holding $f is refused without --force" -- tps merge "$T/s" -o "$T/out"
  expect_stderr_has "$T/out: $f already exists; pass --force" "the refusal names $f and --force"
  [ "$(cat "$T/out/$f")" = theirs ] && [ "$(ls -A "$T/out")" = "$f" ] && ok "$f is left as it was, nothing written beside it" ||
    { notok "$f is left as it was"; ls -A "$T/out" | diag; }
done
# Several: all named at once.
rm -rf "$T/out"; mkdir -p "$T/out"
echo theirs >"$T/out/config.json"; echo theirs >"$T/out/tokenizer.json"
expect_exit 1 "merge into a directory holding two of its files" -- tps merge "$T/s" -o "$T/out"
expect_stderr_has "config.json, tokenizer.json already exist; pass --force to replace them" "both are named"
# A file merge would not write is no obstacle.
rm -rf "$T/out"; mkdir -p "$T/out"; echo mine >"$T/out/README.md"
expect_exit 0 "merge into a directory holding only other files" -- tps merge "$T/s" -o "$T/out"
[ "$(cat "$T/out/README.md")" = mine ] && ok "the other file is kept" || notok "the other file is kept"
# --force replaces every one of them.
rm -rf "$T/out"; mkdir -p "$T/out"
for f in config.json generation_config.json tokenizer.json model.safetensors.index.json $parts; do echo theirs >"$T/out/$f"; done
expect_exit 0 "merge --force replaces them" -- tps merge "$T/s" -o "$T/out" --force
same=1
for f in config.json generation_config.json tokenizer.json tokenizer_config.json $parts; do
  cmp -s "$T/m/$f" "$T/out/$f" || { echo "#   $f differs"; same=0; }
done
[ "$same" = 1 ] && ok "merge --force gives back the source's files byte for byte" || notok "merge --force output"
finish
