/* kcopy.c - copies the kernel makes, and what a file system allows.
 *
 * A split's contiguous pieces are runs of the source's bytes. Where the
 * output's file system shares blocks (XFS with reflink, btrfs, bcachefs,
 * ZFS 2.2+), FICLONERANGE makes a run's whole blocks the source's own: no
 * byte moves and no space is taken until one side is written again. Where
 * copy_file_range is the file system's own copy (NFS 4.2, SMB, Ceph: the
 * server copies), it copies runs without their bytes crossing the network.
 * Elsewhere the caller writes the bytes itself, as before: on ext4 and
 * tmpfs copy_file_range is the kernel's generic copy through a pipe, which
 * measured slower than the caller's one copy from the source's mapping.
 *
 * What the output takes is decided once per output file system, by a probe
 * into a temporary file in the output directory, and said under -v; a
 * refusal later (a source file on another file system) lowers the mode for
 * the rest of the run, said once. Refusals are the errnos a kernel or a file
 * system gives for "not here": EOPNOTSUPP, ENOTTY, EXDEV, EINVAL, ENOSYS.
 * Anything else (EIO, ENOSPC) is an error of the copy, reported as such. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#ifndef FICLONERANGE
struct file_clone_range {
    int64_t src_fd;
    uint64_t src_offset, src_length, dest_offset;
};
#define FICLONERANGE _IOW(0x94, 13, struct file_clone_range)
#endif

static int refused(int e)
{
    return e == EOPNOTSUPP || e == ENOTSUP || e == ENOTTY || e == EXDEV || e == EINVAL ||
           e == ENOSYS;
}

/* The file systems statfs names; only those the messages or the read path
 * need, others by their magic number. */
/* unmappable: mapping the source is unsafe or slow there, read with pread.
 * native: copy_file_range is the file system's own copy (on the server:
 * NFS 4.2, SMB, Ceph). Elsewhere it is the kernel's generic copy through a
 * pipe, which measured slower than tpshard's one copy from the source's
 * mapping (bench/fs.sh, loop ext4: 1.40x cp against 1.22x; tmpfs no
 * faster), so it is not used for whole runs there. */
static const struct {
    unsigned long magic;
    const char *name;
    int unmappable, native;
} fs_names[] = {
    {0x58465342, "xfs", 0, 0},     {0x9123683E, "btrfs", 0, 0},    {0xCA451A4E, "bcachefs", 0, 0},
    {0x2FC12FC1, "zfs", 0, 0},     {0xEF53, "ext4", 0, 0},         {0x01021994, "tmpfs", 0, 0},
    {0x6969, "nfs", 1, 1},         {0x65735546, "fuse", 1, 0},     {0x0BD00BD0, "lustre", 1, 0},
    {0xFF534D42, "cifs", 1, 1},    {0xFE534D42, "smb2", 1, 1},     {0x517B, "smb", 1, 0},
    {0x794C7630, "overlayfs", 0, 0}, {0x858458F6, "ramfs", 0, 0},  {0x5346414F, "afs", 1, 0},
    {0x00C36400, "ceph", 1, 1},    {0x01021997, "9p", 1, 0},
};

static const char *fs_name(unsigned long magic, char *buf, size_t len, int *unmappable,
                           int *native)
{
    for (size_t i = 0; i < sizeof fs_names / sizeof fs_names[0]; i++)
        if (fs_names[i].magic == magic) {
            if (unmappable) *unmappable = fs_names[i].unmappable;
            if (native) *native = fs_names[i].native;
            return fs_names[i].name;
        }
    if (unmappable) *unmappable = 0;
    if (native) *native = 0;
    snprintf(buf, len, "fs 0x%lx", magic);
    return buf;
}

const char *tps_fs_unmappable(int fd, char *name, size_t len)
{
    struct statfs sf;
    int unm = 0;
    if (fstatfs(fd, &sf) != 0) return NULL;
    const char *n = fs_name((unsigned long)sf.f_type, name, len, &unm, NULL);
    if (!unm) return NULL;
    if (n != name) snprintf(name, len, "%s", n);
    return name;
}

static const char *mode_words(int mode)
{
    return mode == TPS_KC_CLONE   ? "blocks shared with the source (FICLONERANGE)"
           : mode == TPS_KC_RANGE ? "copies on the server (copy_file_range)"
                                  : "copies through user space";
}

const char *tps_kcopy_mode_name(int mode)
{
    return mode == TPS_KC_CLONE ? "reflink" : mode == TPS_KC_RANGE ? "copy_file_range" : "write";
}

void tps_kcopy_probe(tps_ctx *ctx, tps_kcopy *K, int src_fd, const char *out_dir, int plain)
{
    memset(K, 0, sizeof *K);
    K->mode = TPS_KC_USER;
    K->blk = 4096;
    struct statfs sf;
    struct statvfs sv;
    char nb[32];
    snprintf(K->fs, sizeof K->fs, "%s",
             statfs(out_dir, &sf) == 0
                 ? fs_name((unsigned long)sf.f_type, nb, sizeof nb, NULL, &K->native)
                 : "unknown fs");
    if (statvfs(out_dir, &sv) == 0 && sv.f_bsize >= 512 && sv.f_bsize <= (1u << 20) &&
        !(sv.f_bsize & (sv.f_bsize - 1)))
        K->blk = (uint32_t)sv.f_bsize;
    struct stat st;
    char *probe = NULL, *pname = tps_path_join(out_dir, ".tpshard.probe");
    if (pname) probe = tps_tmp_name(pname);
    free(pname);
    int fd = probe ? open(probe, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1;
    if (fd < 0 || fstat(src_fd, &st) != 0 || st.st_size <= 0) {
        tps_log(ctx, TPS_LOG_INFO, "%s (%s): %s (no probe file: %s)", out_dir, K->fs,
                mode_words(K->mode), strerror(errno));
        if (fd >= 0) close(fd);
        if (fd >= 0) unlink(probe);
        free(probe);
        return;
    }
    uint64_t n = (uint64_t)st.st_size >= K->blk ? K->blk : 0; /* 0: to the source's end */
    struct file_clone_range cr = {.src_fd = src_fd, .src_offset = 0, .src_length = n,
                                  .dest_offset = 0};
    char why[256] = "";
    if (ioctl(fd, FICLONERANGE, &cr) == 0) {
        K->mode = TPS_KC_CLONE;
    } else {
        snprintf(why, sizeof why, "FICLONERANGE: %s", strerror(errno));
        off64_t i = 0, o = 0;
        size_t len = n ? n : (size_t)st.st_size;
        ssize_t w = copy_file_range(src_fd, &i, fd, &o, len, 0);
        if (w > 0 && K->native)
            K->mode = TPS_KC_RANGE;
        else if (w > 0)
            snprintf(why + strlen(why), sizeof why - strlen(why),
                     "; copy_file_range is the kernel's generic copy on %s, slower than one copy "
                     "from the source's mapping", K->fs);
        else
            snprintf(why + strlen(why), sizeof why - strlen(why), "; copy_file_range: %s",
                     w == 0 ? "copied nothing" : strerror(errno));
    }
    close(fd);
    unlink(probe);
    free(probe);
    K->can_clone = K->mode == TPS_KC_CLONE;
    if (plain) {
        K->mode = TPS_KC_USER;
        tps_log(ctx, TPS_LOG_INFO, "%s (%s): --copy: %s%s", out_dir, K->fs, mode_words(K->mode),
                K->can_clone ? " (laid out as for shared blocks all the same)" : "");
    } else if (K->mode == TPS_KC_CLONE)
        tps_log(ctx, TPS_LOG_INFO, "%s (%s): %s, block size %u", out_dir, K->fs,
                mode_words(K->mode), K->blk);
    else
        tps_log(ctx, TPS_LOG_INFO, "%s (%s): %s (%s)", out_dir, K->fs, mode_words(K->mode), why);
}

/* The kernel refused a copy it was asked for: the mode goes down for the
 * rest of the run, said once. */
static void lower(tps_ctx *ctx, tps_kcopy *K, int from, int to, const char *what, int e)
{
    int cur = from;
    if (__atomic_compare_exchange_n(&K->mode, &cur, to, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        tps_log(ctx, TPS_LOG_INFO, "%s refused (%s): %s from here on", what, strerror(e),
                mode_words(to));
}

/* copy_file_range until len bytes are copied; *done 0 when it was refused
 * (the mode lowered: the caller writes the range itself). */
static tps_err range_copy(tps_ctx *ctx, tps_kcopy *K, int in_fd, const char *in_path,
                          uint64_t in_off, int out_fd, const char *out_path, uint64_t out_off,
                          uint64_t len, int *done)
{
    off64_t i = (off64_t)in_off, o = (off64_t)out_off;
    *done = 0;
    while (len) {
        size_t want = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t w = copy_file_range(in_fd, &i, out_fd, &o, want, 0);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && refused(errno)) {
            lower(ctx, K, __atomic_load_n(&K->mode, __ATOMIC_RELAXED), TPS_KC_USER,
                  "copy_file_range", errno);
            return TPS_OK;
        }
        if (w < 0)
            return tps_fail(ctx, errno == ENOSPC || errno == EDQUOT ? TPS_E_NOSPACE : TPS_E_IO,
                            "%s: copy_file_range from %s: %s", out_path, in_path, strerror(errno));
        if (w == 0)
            return tps_fail(ctx, TPS_E_IO, "%s: copy_file_range: %s ended %llu bytes early",
                            out_path, in_path, (unsigned long long)len);
        len -= (uint64_t)w;
    }
    *done = 1;
    return TPS_OK;
}

uint64_t tps_kcopy_shareable(uint64_t in_off, uint64_t out_off, uint64_t len, uint32_t blk)
{
    if ((in_off - out_off) % blk) return 0;
    uint64_t lo = (in_off + blk - 1) / blk * blk, hi = (in_off + len) / blk * blk;
    return hi > lo ? hi - lo : 0;
}

tps_err tps_kcopy_range(tps_ctx *ctx, tps_kcopy *K, int in_fd, const char *in_path,
                        uint64_t in_off, int out_fd, const char *out_path, uint64_t out_off,
                        uint64_t len, int *done)
{
    int mode = __atomic_load_n(&K->mode, __ATOMIC_RELAXED);
    *done = 0;
    if (mode == TPS_KC_USER) return TPS_OK;
    uint64_t sh = mode == TPS_KC_CLONE ? tps_kcopy_shareable(in_off, out_off, len, K->blk) : 0;
    /* nothing to share: the caller's own copy, unless the file system copies better */
    if (!sh && !K->native) return TPS_OK;
    if (!sh)
        return range_copy(ctx, K, in_fd, in_path, in_off, out_fd, out_path, out_off, len, done);
    /* The whole blocks cloned; the partial blocks at either end copied. */
    uint64_t head = (K->blk - in_off % K->blk) % K->blk, t = head + sh;
    struct file_clone_range cr = {.src_fd = in_fd, .src_offset = in_off + head, .src_length = sh,
                                  .dest_offset = out_off + head};
    if (ioctl(out_fd, FICLONERANGE, &cr) != 0) {
        int e = errno;
        if (!refused(e))
            return tps_fail(ctx, e == ENOSPC || e == EDQUOT ? TPS_E_NOSPACE : TPS_E_IO,
                            "%s: FICLONERANGE from %s: %s", out_path, in_path, strerror(e));
        lower(ctx, K, TPS_KC_CLONE, K->native ? TPS_KC_RANGE : TPS_KC_USER, "FICLONERANGE", e);
        return tps_kcopy_range(ctx, K, in_fd, in_path, in_off, out_fd, out_path, out_off, len,
                               done);
    }
    int ok = 1;
    if (head)
        TPS_TRY(range_copy(ctx, K, in_fd, in_path, in_off, out_fd, out_path, out_off, head, &ok));
    if (ok && t < len)
        TPS_TRY(range_copy(ctx, K, in_fd, in_path, in_off + t, out_fd, out_path, out_off + t,
                           len - t, &ok));
    if (ok) __atomic_add_fetch(&K->shared, sh, __ATOMIC_RELAXED);
    *done = ok;
    return TPS_OK;
}
