#!/bin/sh
# Runs of source bytes reach the rank files the best way the output's file
# system takes them: shared blocks (FICLONERANGE) on loop-mounted XFS and
# btrfs, tpshard's own copy on ext4 and tmpfs (whose copy_file_range is the
# kernel's generic one) and where neither works (--copy, another file system
# than the source's, also when the kernel refuses in the middle of a run). Each way writes the bytes a --copy split
# writes; a source overwritten in place after a shared split leaves the split
# intact (check passes, verify --source names the changed source); merge and
# reshard share blocks the same way; a source on FUSE is read with pread.
# Needs root and loop devices (bindfs for FUSE): skipped otherwise.
. "$TOP/tests/cli/lib.sh"

skip_all() { echo "skip - reflink: $*"; finish; }
[ "$(id -u)" = 0 ] || skip_all "needs root to loop-mount XFS and btrfs images"
command -v losetup >/dev/null 2>&1 || skip_all "no losetup"
MNT=""
cleanup() { for m in $MNT; do umount "$m" 2>/dev/null; done; }
trap cleanup EXIT

# mkfs_mount NAME MKFS...: a 320 MiB image formatted by MKFS, loop-mounted at
# $T/NAME; 1 when it cannot be (no mkfs, no loop device, no such file system).
mkfs_mount() {
  name=$1; shift
  command -v "$1" >/dev/null 2>&1 || return 1
  truncate -s 320M "$T/$name.img" && "$@" "$T/$name.img" >/dev/null 2>&1 && mkdir -p "$T/$name" &&
    mount -o loop "$T/$name.img" "$T/$name" 2>/dev/null || return 1
  MNT="$T/$name $MNT"
}

# A llama whose tensors are whole 4 KiB blocks or more (norms are not: they
# go through the small-tensor path), 2.6 MiB.
gen llama "$T/m0" --layers 2 --hidden 256 --heads 4 --kv-heads 4 --inter 512 --vocab 1024 >/dev/null ||
  { notok "make the model"; finish; }

# same_files A B: every rank file of A equals B's, byte for byte
same_files() {
  n=0
  for f in "$1"/model-rank-*.safetensors; do
    cmp -s "$f" "$2/$(basename "$f")" || return 1
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] && [ "$n" = "$(ls "$2"/model-rank-*.safetensors | wc -l)" ]
}
# shared_extents FILE: filefrag's count of extents flagged shared
shared_extents() { filefrag -v "$1" 2>/dev/null | grep -c 'shared' || true; }
# json KEY: split/plan --json's KEY of $OUT (dotted for nested)
json() { python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): d = d[k]
print(d)' "$OUT" "$1" 2>/dev/null; }
# maxpad DIR: the most trailing spaces of a rank file's header in DIR (the
# reference writer pads to 8 bytes: at most 7)
maxpad() { python3 -c 'import glob, struct, sys
m = 0
for p in glob.glob(sys.argv[1] + "/model-rank-*.safetensors"):
    f = open(p, "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = f.read(n)
    m = max(m, len(h) - len(h.rstrip(b" ")))
print(m)' "$1"; }
# overwrite FILE TENSOR: random bytes over the first 8 KiB of TENSOR in place
overwrite() {
  off=$(python3 -c 'import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
print(8 + n + h[sys.argv[2]]["data_offsets"][0])' "$1" "$2") &&
    dd if=/dev/urandom of="$1" bs=1 seek="$off" count=8192 conv=notrunc status=none
}

# cow FS MKFS...: the whole story on a file system that shares blocks.
cow() {
  fs=$1; shift
  if ! mkfs_mount "$fs" "$@"; then
    echo "skip - reflink on $fs: cannot make and loop-mount a $fs image here ($1 missing, no loop device, or no kernel support)"
    return
  fi
  D="$T/$fs"
  cp -r "$T/m0" "$D/m"
  expect_exit 0 "$fs: split --tp 4" -- tps split "$D/m" --tp 4 -o "$D/s" -v
  expect_stderr_has "blocks shared with the source (FICLONERANGE)" "$fs: -v says blocks are shared"
  expect_exit 0 "$fs: split --copy" -- tps split "$D/m" --tp 4 -o "$D/c" --copy -v
  expect_stderr_has "--copy: copies through user space" "$fs: -v says --copy copies"
  same_files "$D/s" "$D/c" && ok "$fs: rank files equal a --copy split byte for byte" ||
    notok "$fs: rank files differ from a --copy split"
  p=$(maxpad "$D/s")
  [ "$p" -ge 8 ] && ok "$fs: headers padded to line tensors up with the source's blocks ($p spaces)" ||
    notok "$fs: no header padded ($p spaces at most)"
  r0="$D/s/model-rank-0-part-0.safetensors"
  [ "$(shared_extents "$r0")" -gt 0 ] && [ "$(shared_extents "$D/c/model-rank-0-part-0.safetensors")" = 0 ] &&
    ok "$fs: rank 0 shares extents with the source, --copy's shares none" ||
    { notok "$fs: shared extents: split $(shared_extents "$r0"), --copy $(shared_extents "$D/c/model-rank-0-part-0.safetensors")"; filefrag -v "$r0" | diag; }
  run tps split "$D/m" --tp 4 -o "$D/s" --force --json
  sh=$(json bytes_shared) wr=$(json bytes_written) how=$(json copy)
  run tps plan "$D/m" --tp 4 --json
  [ "$how" = reflink ] && [ "$sh" -gt $((wr / 2)) ] && [ "$sh" = "$(json sharing.bytes_shared)" ] &&
    ok "$fs: split --json: copy reflink, $sh of $wr bytes shared, as plan --json said" ||
    notok "$fs: split --json: copy $how, $sh of $wr shared; plan says $(json sharing.bytes_shared)"
  run tps split "$D/m" --tp 4 -o "$D/c" --force --copy --json
  [ "$(json bytes_shared)" = 0 ] && [ "$(json copy)" = write ] && ok "$fs: split --copy --json: nothing shared" ||
    notok "$fs: split --copy --json: $(json bytes_shared) shared, copy $(json copy)"

  # merge gives the source back, sharing the rank files' blocks
  expect_exit 0 "$fs: merge" -- tps merge "$D/s" -o "$D/back" -v
  expect_stderr_has "blocks shared" "$fs: merge -v says blocks are shared"
  cmp -s "$D/back/model.safetensors" "$D/m/model.safetensors" && ok "$fs: merge equals the source byte for byte" ||
    notok "$fs: merge differs from the source"
  [ "$(shared_extents "$D/back/model.safetensors")" -gt 0 ] && ok "$fs: the merged file shares extents" ||
    notok "$fs: the merged file shares no extent"
  expect_exit 0 "$fs: merge --copy" -- tps merge "$D/s" -o "$D/back2" --copy
  cmp -s "$D/back2/model.safetensors" "$D/m/model.safetensors" && ok "$fs: merge --copy equals the source" ||
    notok "$fs: merge --copy differs from the source"

  # reshard 4 -> 2 from the rank files: shares their blocks, holds the source's tensors
  expect_exit 0 "$fs: reshard --tp 2" -- tps split "$D/s" --tp 2 -o "$D/r2" -v
  expect_stderr_has "blocks shared" "$fs: reshard -v says blocks are shared"
  [ "$(shared_extents "$D/r2/model-rank-0-part-0.safetensors")" -gt 0 ] && ok "$fs: the reshard shares extents" ||
    notok "$fs: the reshard shares no extent"
  expect_exit 0 "$fs: reshard passes check" -- tps check "$D/r2"
  expect_exit 0 "$fs: reshard passes verify --source" -- tps verify "$D/r2" --source "$D/m"

  # The source overwritten in place after the split: copy-on-write keeps the
  # rank files' bytes, so check still passes, and verify --source sees the change.
  cp "$r0" "$T/r0.before"
  overwrite "$D/m/model.safetensors" model.layers.0.self_attn.q_proj.weight || notok "$fs: overwrite the source"
  cmp -s "$r0" "$T/r0.before" && ok "$fs: rank 0 unchanged after the source was overwritten" ||
    notok "$fs: rank 0 changed with the source"
  expect_exit 0 "$fs: check passes after the source was overwritten" -- tps check "$D/s"
  expect_exit 0 "$fs: the reshard passes check too" -- tps check "$D/r2"
  run tps verify "$D/s" --source "$D/m"
  [ "$RC" = 1 ] && grep -q "q_proj" "$OUT" "$ERR" && ok "$fs: verify --source fails on the changed tensor" ||
    { notok "$fs: verify --source after the overwrite: exit $RC"; diag "$OUT"; diag "$ERR"; }

  # A run refused in the middle: rank 1 of a shard directory on another file
  # system. The probe (rank 0's file) clones; rank 1's runs are refused, and
  # the split goes on in the kernel or through user space, said under -v.
  mkdir -p "$D/mix" && cp "$D/s"/* "$D/mix/" && mv "$D/mix/model-rank-1-part-0.safetensors" "$T/r1.safetensors" &&
    ln -s "$T/r1.safetensors" "$D/mix/model-rank-1-part-0.safetensors"
  expect_exit 0 "$fs: reshard of a directory with a rank on another file system" -- tps split "$D/mix" --tp 2 -o "$D/mix2" -v
  expect_stderr_has "FICLONERANGE refused" "$fs: -v says the clone was refused and how it goes on"
  expect_exit 0 "$fs: its output passes check" -- tps check "$D/mix2"
  same_files "$D/mix2" "$D/r2" && ok "$fs: and equals the reshard that shared every run" ||
    notok "$fs: the mixed reshard differs from the shared one"

  # Free space is needed for the bytes not shared only: with the file system
  # filled to less than the rank files' size, a split still fits, --copy not.
  if [ "$fs" = xfs ]; then
    rm -rf "$D/c" "$D/back" "$D/back2" "$D/r2" "$D/mix" "$D/mix2" "$D/s" "$D/x"; sync -f "$D"; sleep 2
    run tps plan "$D/m" --tp 4 --json
    total=$(( ($(json sharing.bytes_shared) + $(json sharing.bytes_copied)) / 1024 ))
    avail=$(df -Pk "$D" | awk 'NR == 2 {print $4}')
    # free: 256 KiB less than the rank files take (which the bytes copied are far below)
    fallocate -l $(( (avail - total + 256) * 1024 )) "$D/filler" && sync -f "$D" || notok "$fs: fill the file system"
    expect_exit 0 "$fs: a split larger than the free space fits: its blocks are shared" -- tps split "$D/m" --tp 4 -o "$D/tight"
    expect_exit 1 "$fs: the same split with --copy does not" -- tps split "$D/m" --tp 4 -o "$D/tight2" --copy
    expect_stderr_has "not enough free space" "$fs: --copy says there is not enough free space"
    rm -f "$D/filler"
  fi
}

cow xfs mkfs.xfs -q -m reflink=1
cow btrfs mkfs.btrfs -q

# ext4 (loop) and tmpfs: no shared blocks, and copy_file_range is only the
# kernel's generic copy there (slower than tpshard's own from the mapping):
# the rank files are byte for byte those of --copy, headers unpadded.
kcopy() {
  fs=$1 D=$2
  cp -r "$T/m0" "$D/m"
  expect_exit 0 "$fs: split" -- tps split "$D/m" --tp 4 -o "$D/s" -v
  expect_stderr_has "copies through user space (FICLONERANGE: Operation not supported; copy_file_range is the kernel's generic copy on $fs" \
    "$fs: -v says why neither a clone nor copy_file_range"
  expect_exit 0 "$fs: split --copy" -- tps split "$D/m" --tp 4 -o "$D/c" --copy -q
  same_files "$D/s" "$D/c" && ok "$fs: rank files equal a --copy split byte for byte" ||
    notok "$fs: rank files differ from a --copy split"
  p=$(maxpad "$D/s")
  [ "$p" -lt 8 ] && ok "$fs: headers padded as the reference writer pads them ($p spaces at most)" ||
    notok "$fs: a header has $p trailing spaces"
  expect_exit 0 "$fs: check" -- tps check "$D/s"
  run tps split "$D/m" --tp 4 -o "$D/s" --force --json
  [ "$(json copy)" = write ] && [ "$(json bytes_shared)" = 0 ] && ok "$fs: split --json: write, nothing shared" ||
    notok "$fs: split --json: copy $(json copy), $(json bytes_shared) shared"
  expect_exit 0 "$fs: merge" -- tps merge "$D/s" -o "$D/back" -v
  expect_stderr_has "generic copy" "$fs: merge -v says the same"
  cmp -s "$D/back/model.safetensors" "$D/m/model.safetensors" && ok "$fs: merge equals the source byte for byte" ||
    notok "$fs: merge differs from the source"
}
if mkfs_mount ext4 mkfs.ext4 -q -F; then
  kcopy ext4 "$T/ext4"
else
  echo "skip - ext4: cannot make and loop-mount an ext4 image here"
fi
if mkdir -p "$T/tmpfs" && mount -t tmpfs -o size=64m tmpfs "$T/tmpfs" 2>/dev/null; then
  MNT="$T/tmpfs $MNT"
  kcopy tmpfs "$T/tmpfs"
  # The source on tmpfs, the output on XFS: neither a clone nor
  # copy_file_range crosses file systems; plain writes, the same bytes.
  if [ -d "$T/xfs/c" ]; then
    expect_exit 0 "tmpfs source, xfs output: split" -- tps split "$T/tmpfs/m" --tp 4 -o "$T/xfs/x" -v
    expect_stderr_has "copies through user space" "-v says the bytes go through user space"
    expect_exit 0 "tmpfs source, xfs output: check" -- tps check "$T/xfs/x"
    run tps split "$T/tmpfs/m" --tp 4 -o "$T/xfs/x" --force --json
    [ "$(json copy)" = write ] && ok "tmpfs source, xfs output: split --json says write" ||
      notok "tmpfs source, xfs output: split --json says $(json copy)"
  fi
else
  echo "skip - tmpfs: cannot mount a tmpfs here"
fi
# The read path follows the source's file system: on FUSE (bindfs) the
# source is read with pread, said under -v; --mmap maps it all the same.
if command -v bindfs >/dev/null 2>&1 && mkdir -p "$T/fuse" && bindfs "$T/m0" "$T/fuse" 2>/dev/null; then
  MNT="$T/fuse $MNT"
  expect_exit 0 "fuse source: split" -- tps split "$T/fuse" --tp 4 -o "$T/fo" -v
  expect_stderr_has "(fuse): reading with pread, not through mappings" "-v says a FUSE source is read with pread"
  expect_exit 0 "fuse source: split --mmap" -- tps split "$T/fuse" --tp 4 -o "$T/fo2" --mmap -v
  grep -q "reading with pread" "$ERR" && notok "--mmap still reads a FUSE source with pread" ||
    ok "--mmap maps a FUSE source"
  same_files "$T/fo" "$T/fo2" && ok "fuse source: both write the same rank files" ||
    notok "fuse source: pread and mapped splits differ"
  expect_exit 0 "fuse source: check" -- tps check "$T/fo"
else
  echo "skip - fuse: no bindfs, or it cannot mount here (apt-get install bindfs)"
fi
cleanup
trap - EXIT
finish
