/* outlock.c - one split writing an output directory at a time.
 *
 * A split holds DIR/.tpshard.writing from before it looks at the directory
 * until its manifest is in place: a plain split exclusively, the --ranks
 * runs of one split shared (they add to one manifest under .tpshard.lock,
 * see join.c). A split that cannot get it is refused at once, naming the
 * holder, rather than two splits interleaving their renames and manifests
 * (one of them could exit 0 with the other's files and no manifest).
 *
 * The file holds one record, "PID HOST KIND" (KIND split or ranks), always
 * written whole: a new file is made with its record under a temporary name
 * and linked into place (atomic on NFS too), so no reader sees it empty.
 * The last holder removes it; a holder that was killed leaves it unlocked,
 * and the next split takes it over. Taking a file that its last holder is
 * removing is noticed (the path no longer names the file locked) and
 * retried. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define WRITER_NAME ".tpshard.writing"
#define RECORD_LEN 128 /* fixed: a rewrite never leaves a longer one's tail */
#define TRIES 2000     /* of about 1 ms each: a last holder leaving */

static void make_record(char rec[RECORD_LEN], int shared)
{
    char host[65] = "";
    if (gethostname(host, sizeof host - 1) != 0 || !*host) strcpy(host, "-");
    for (char *h = host; *h; h++)
        if (*h == ' ' || *h == '\n') *h = '_';
    int n = snprintf(rec, RECORD_LEN, "%d %s %s", (int)getpid(), host, shared ? "ranks" : "split");
    if (n < 0 || n > RECORD_LEN - 1) n = RECORD_LEN - 1;
    memset(rec + n, ' ', (size_t)(RECORD_LEN - 1 - n));
    rec[RECORD_LEN - 1] = '\n';
}

/* fd and path name the same file. */
static int still_there(int fd, const char *path)
{
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static void nap(void)
{
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

static int warn_unlocked(tps_ctx *ctx, const char *dir, int e)
{
    tps_log(ctx, TPS_LOG_WARN,
            "%s: cannot lock %s (%s): another split writing into this directory at the same "
            "time would not be noticed",
            dir, WRITER_NAME, strerror(e));
    return -1;
}

/* A new file with our record, locked, linked into place: its descriptor,
 * -1 when another split linked one first (errno EEXIST), -2 when locking
 * cannot work here. */
static int create_locked(const char *path, int shared, int *err)
{
    char *tmp = tps_tmp_name(path);
    int fd = tmp ? open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    char rec[RECORD_LEN];
    make_record(rec, shared);
    int rc = -2;
    *err = tmp ? errno : ENOMEM;
    if (fd >= 0) {
        if (pwrite(fd, rec, RECORD_LEN, 0) != RECORD_LEN || flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
            *err = errno;
        } else if (link(tmp, path) == 0) {
            rc = fd;
        } else {
            *err = errno;
            if (errno == EEXIST) rc = -1;
        }
    }
    if (rc < 0 && fd >= 0) close(fd);
    if (tmp) unlink(tmp);
    free(tmp);
    return rc;
}

int tps_out_claim(tps_ctx *ctx, const char *dir, int shared, tps_err *rc)
{
    *rc = TPS_OK;
    char *path = tps_path_join(dir, WRITER_NAME);
    if (!path) {
        *rc = tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        return -1;
    }
    char rec[RECORD_LEN + 1] = "";
    int result = -1;
    for (int attempt = 0; attempt < TRIES && !ctx->interrupted; attempt++) {
        int fd = open(path, O_RDWR | O_CLOEXEC), e;
        if (fd < 0 && errno == ENOENT) {
            fd = create_locked(path, shared, &e);
            if (fd >= 0) {
                result = fd;
                goto done;
            }
            if (fd == -1) continue; /* another split made it first: look at theirs */
            result = warn_unlocked(ctx, dir, e);
            goto done;
        }
        if (fd < 0) {
            result = warn_unlocked(ctx, dir, errno);
            goto done;
        }
        if (flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB) == 0) {
            if (!still_there(fd, path)) { /* its last holder removed it */
                close(fd);
                continue;
            }
            char mine[RECORD_LEN];
            make_record(mine, shared);
            if (pwrite(fd, mine, RECORD_LEN, 0) != RECORD_LEN) {} /* the record only names us */
            result = fd;
            goto done;
        }
        e = errno;
        if (e != EWOULDBLOCK && e != EAGAIN) {
            close(fd);
            result = warn_unlocked(ctx, dir, e);
            goto done;
        }
        /* Held. Shared holders are --ranks runs writing; an exclusive one is
         * a split writing, or the last --ranks run leaving (for a moment). */
        int sh_free = !shared && flock(fd, LOCK_SH | LOCK_NB) == 0;
        ssize_t n = pread(fd, rec, RECORD_LEN, 0);
        rec[n > 0 ? n : 0] = 0;
        int gone = !still_there(fd, path);
        close(fd);
        char kind[16] = "";
        int pid = 0;
        char host[66] = "";
        int parsed = sscanf(rec, "%d %65s %15s", &pid, host, kind) == 3;
        if (gone || (!sh_free && parsed && !strcmp(kind, "ranks")) || !parsed) {
            nap();
            continue;
        }
        char me[65] = "";
        if (gethostname(me, sizeof me - 1) != 0) me[0] = 0;
        if (strcmp(host, me) && strcmp(host, "-"))
            *rc = tps_fail(ctx, TPS_E_EXISTS,
                           "another split (pid %d on %s) is writing %s; wait for it to end or "
                           "choose another -o",
                           pid, host, dir);
        else
            *rc = tps_fail(ctx, TPS_E_EXISTS,
                           "another split (pid %d) is writing %s; wait for it to end or choose "
                           "another -o",
                           pid, dir);
        goto done;
    }
    if (ctx->interrupted) *rc = tps_fail(ctx, TPS_E_INTERRUPTED, "interrupted");
    else
        *rc = tps_fail(ctx, TPS_E_EXISTS,
                       "another split is writing %s (%s stayed locked); wait for it to end or "
                       "choose another -o",
                       dir, WRITER_NAME);
done:
    free(path);
    return result;
}

void tps_out_release(const char *dir, int fd, int shared)
{
    if (fd < 0) return;
    char *path = tps_path_join(dir, WRITER_NAME);
    /* Shared: the last holder is the one that can make it exclusive (a
     * failed try drops our lock, which is what we came to do). */
    int last = !shared || flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (last && path && still_there(fd, path)) unlink(path);
    close(fd);
    free(path);
}
