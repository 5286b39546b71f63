#!/bin/sh
# split in passes (--ranks-per-pass, and the automatic choice past 131072 tensor-rank
# pairs): each pass compiles the layout for its ranks only. The rank files and the manifest
# must be those of the one-pass split, byte for byte, in every layout: the one-pass engine
# is the reference the engines tested (make test-engines), so any difference is a bug here.
# Cases: every conformance model at its tp and layout (KV heads replicated across ranks,
# refined FP8 grids, GPTQ, NVFP4, MXFP4, Gemma 4, DeepSeek), passes of 1, 2 and 3 ranks.
. "$TOP/tests/cli/lib.sh"

for c in "$TOP"/testdata/conformance/*/; do
	name=$(basename "$c")
	case $name in *reject*) continue ;; esac
	tp=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['tp'])" "$c/case.json")
	lay=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('layout','dtensor'))" "$c/case.json")
	[ "$tp" -gt 1 ] || continue
	rm -rf "$T/a"
	tps split "$c/model" --tp "$tp" --layout "$lay" -o "$T/a" -q 2>"$ERR" ||
		{ notok "$name: one pass"; diag "$ERR"; continue; }
	for n in 1 2 3; do
		[ "$n" -lt "$tp" ] || continue
		rm -rf "$T/b"
		if ! tps split "$c/model" --tp "$tp" --layout "$lay" --ranks-per-pass "$n" -o "$T/b" -q 2>"$ERR"; then
			notok "$name: passes of $n"
			diag "$ERR"
			continue
		fi
		d=$(cd "$T/a" && for f in *; do cmp -s "$f" "$T/b/$f" || echo "$f"; done)
		[ "$(ls "$T/a" | wc -l)" = "$(ls "$T/b" | wc -l)" ] || d="$d (file count)"
		[ -z "$d" ] && ok "$name ($lay tp $tp): passes of $n ranks write the same files" ||
			notok "$name ($lay tp $tp): passes of $n: differ: $d"
	done
done

# a DeepSeek-shaped checkpoint (3k tensors: the automatic choice, past 131072 pairs, is
# bench/deepseek.sh's to show) in passes of 3 ranks, read back by check and verify
python3 "$TOP/bench/gen_deepseek.py" "$T/m" --layers 6 --experts 256 --bf16 >"$OUT" 2>"$ERR" ||
	{ notok "bench/gen_deepseek.py"; diag "$ERR"; finish; }
rm -rf "$T/a" "$T/b"
expect_exit 0 "deepseek vllm tp 8: one pass" -- tps split "$T/m" --tp 8 --layout vllm --ranks-per-pass 8 -o "$T/a" -q
expect_exit 0 "deepseek vllm tp 8: passes of 3" -- tps split "$T/m" --tp 8 --layout vllm --ranks-per-pass 3 -o "$T/b" -q
d=$(cd "$T/a" && for f in *; do cmp -s "$f" "$T/b/$f" || echo "$f"; done)
[ -z "$d" ] && ok "deepseek: passes of 3 write the same files" || notok "deepseek: differ: $d"
expect_exit 0 "check reads the split in passes" -- tps check "$T/b"
expect_exit 0 "verify reads it" -- tps verify "$T/b" -q
ls -a "$T/b" | grep -q "tmp" && notok "a pass's temporary left behind" || ok "no pass's temporary left behind"

# refusals
expect_exit 2 "--ranks-per-pass with --ranks" -- tps split "$T/m" --tp 8 --layout vllm --ranks 0 --ranks-per-pass 1 -o "$T/c"
expect_exit 2 "--ranks-per-pass with --pp" -- tps split "$T/m" --tp 2 --pp 2 --layout vllm --ranks-per-pass 1 -o "$T/c"
finish
