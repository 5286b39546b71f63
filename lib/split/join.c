/* join.c - the output directory of a split: what in it is tpshard's,
 * making and claiming it, refusing (or, with --force, removing) another
 * output there, the free space check, removing an older output's leftovers
 * once the new files are in place, and the --ranks runs that fill one
 * directory together: the lock they share, the manifest of their split they
 * join (joinable), re-read under the lock before each adds its ranks. */
#include "internal.h"
#include "split_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static int is_ours(const char *name)
{
    int r, p, n = 0;
    if (strcmp(name, TPS_MANIFEST) == 0) return 1;
    if (sscanf(name, "model-rank-%d-part-%d.safetensors%n", &r, &p, &n) == 2 && name[n] == 0) return 1;
    n = 0;
    if (sscanf(name, "model-pp-%d-tp-%d-part-%d.safetensors%n", &r, &p, &p, &n) == 3 && name[n] == 0)
        return 1;
    /* Temporaries a killed run left behind. */
    if (name[0] == '.' && strstr(name, ".tmp.") &&
        (strncmp(name + 1, "model-rank-", 11) == 0 || strncmp(name + 1, "model-pp-", 9) == 0 ||
         strncmp(name + 1, TPS_MANIFEST, 12) == 0))
        return 2;
    return 0;
}

/* Rank of a rank file or of its temporary under E's naming, -1 when the
 * name is neither (another naming's rank file: not one of E's ranks). */
static int rank_of(const engine *E, const char *name)
{
    int r, p;
    if (name[0] == '.') name++;
    return tps_rank_file_parse(name, E->L->tp, E->L->pp, &r, &p) < 0 ? -1 : r;
}

/* The manifest here, as the sharded reader reads one: its text mapped, all
 * but its two long arrays parsed into *out, their spans in sp (a tree of a
 * DeepSeek-V3-shaped split's 259 MB manifest took 1.7 GB). tx is open on
 * return, error or not: prev_close. */
static tps_err load_manifest(tps_ctx *ctx, const char *dir, cJSON **out, tps_text *tx,
                             tps_js_span *sp)
{
    *out = NULL;
    memset(tx, 0, sizeof *tx);
    sp[0].b = sp[0].e = sp[1].b = sp[1].e = NULL;
    char *p = tps_path_join(dir, TPS_MANIFEST);
    tps_err rc = p ? TPS_OK : TPS_E_NOMEM;
    if (p && tps_exists(p)) {
        rc = tps_text_open(ctx, p, TPS_MAX_MANIFEST_FILE, tx);
        if (!rc) rc = tps_js_parse_manifest(ctx, p, tx->p, tx->len, out, sp);
    }
    free(p);
    return rc;
}

/* The joined manifest let go. */
static void prev_close(cJSON **m, tps_text *tx, tps_js_span *sp)
{
    cJSON_Delete(*m);
    *m = NULL;
    if (tx->p) tps_text_close(tx);
    sp[0].b = sp[0].e = sp[1].b = sp[1].e = NULL;
}

void tps_sp_prev_close(engine *E) { prev_close(&E->prev, &E->prev_text, E->prev_sp); }

/* A manifest that --ranks runs can add to: same source, plan, tp, tensors. */
static int joinable(const engine *E, const cJSON *m, const tps_js_span *sp)
{
    const tps_ckpt *ck = E->ck;
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(m, "tp");
    const cJSON *pn = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "plan"), "name");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "source"), "stem");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(m, "tensors");
    const cJSON *ln = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "layout"), "name");
    const char *lname = cJSON_IsString(ln) ? ln->valuestring : "dtensor";
    int ep = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "layout"), "ep"));
    if (ep != E->L->ep) return 0;
    /* MXFP4 experts laid out for another MoE backend have other shapes */
    const cJSON *mb = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "layout"),
                                                       "moe_backend");
    const tps_moe_backend *mine = tps_layout_moe_backend(E->L);
    if (mine ? !cJSON_IsString(mb) || strcmp(mb->valuestring, mine->name) : mb != NULL) return 0;
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(m, "pp");
    if ((pp ? !cJSON_IsNumber(pp) || pp->valueint != E->L->pp : E->L->pp != 1)) return 0;
    if (!cJSON_IsNumber(tp) || tp->valueint != E->L->tp || !cJSON_IsString(pn) ||
        strcmp(lname, tps_layout_name(E->L)) ||
        strcmp(pn->valuestring, tps_plan_name(E->L->plan)) || !cJSON_IsString(st) ||
        strcmp(st->valuestring, ck->stem) || !cJSON_IsArray(ts))
        return 0;
    size_t i = 0, kept = 0, n = 0;
    for (size_t k = 0; k < ck->n; k++) kept += !tps_layout_dropped(E->L, k);
    /* its tensors one at a time, from the text: the same names in the same order */
    tps_js_iter it = {0};
    tps_js_iter_start(&it, &sp[0], ts, "tensors");
    int same = 1;
    for (const cJSON *t; same; i++, n++) {
        if (tps_js_iter_next(E->ctx, TPS_MANIFEST, &it, &t) != TPS_OK) same = 0;
        else if (!t) break;
        while (same && i < ck->n && tps_layout_dropped(E->L, i)) i++;
        const cJSON *nm = same ? cJSON_GetObjectItemCaseSensitive(t, "name") : NULL;
        if (same && (i == ck->n || !cJSON_IsString(nm) || strcmp(nm->valuestring, ck->t[i].name)))
            same = 0;
    }
    tps_js_iter_free(&it);
    return same && n == kept;
}

#define LOCK_NAME ".tpshard.lock"

/* The lock --ranks runs sharing a directory take to read and write its
 * manifest (flock: across machines too on NFS; Lustre needs -o flock).
 * Returns the descriptor to close, or -1 after a warning: without it
 * the runs still write their own files, but may drop each other's manifest
 * entries. */
static int lock_dir(tps_ctx *ctx, const char *dir)
{
    char *lp = tps_path_join(dir, LOCK_NAME);
    int fd = lp ? open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
    int rc = fd >= 0 ? 0 : -1;
    while (fd >= 0 && (rc = flock(fd, LOCK_EX)) != 0 && errno == EINTR && !ctx->interrupted) {}
    if (rc != 0) {
        tps_log(ctx, TPS_LOG_WARN,
                "%s: cannot lock %s (%s): --ranks runs writing into this directory at the same "
                "time may drop each other's manifest entries",
                dir, LOCK_NAME, strerror(errno));
        if (fd >= 0) close(fd);
        fd = -1;
    }
    free(lp);
    return fd;
}

/* Removes every rank file, temporary and manifest of an older output. */
static void remove_output(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!is_ours(de->d_name)) continue;
        char *p = tps_path_join(dir, de->d_name);
        if (p) unlink(p);
        free(p);
    }
    closedir(d);
}

/* A --ranks run, under the lock: join the manifest of this split if there is
 * one; replace another split's output only with --force. Rank files of other
 * ranks that no manifest records are a run still writing, or a killed one:
 * left alone, and overwritten when their rank is written. */
static tps_err prepare_join(engine *E, const tps_split_opts *o)
{
    tps_ctx *ctx = E->ctx;
    const char *dir = o->out_dir;
    tps_err rc = TPS_OK;
    int lfd = lock_dir(ctx, dir);
    cJSON *m = NULL;
    tps_text tx;
    tps_js_span sp[2];
    if (load_manifest(ctx, dir, &m, &tx, sp) != TPS_OK) {
        prev_close(&m, &tx, sp); /* unreadable: another output, to replace */
        char *mp = tps_path_join(dir, TPS_MANIFEST);
        int there = mp && tps_exists(mp);
        free(mp);
        if (there) m = cJSON_CreateObject();
    }
    if (m && joinable(E, m, sp)) {
        /* what the checks below need is all in the rest: the arrays are read again
         * when the manifest is recorded */
        if (tx.p) tps_text_close(&tx);
        sp[0].b = sp[1].b = NULL;
        E->prev = m;
        const cJSON *pw = cJSON_GetObjectItemCaseSensitive(m, "ranks_written");
        for (const cJSON *r = pw ? pw->child : NULL; r && !o->force; r = r->next)
            TPS_FAIL_IF(cJSON_IsNumber(r) && r->valueint >= 0 && r->valueint < E->nranks &&
                            E->write[r->valueint],
                        ctx, TPS_E_EXISTS,
                        "%s: rank %d is already written here; pass --force to rewrite the ranks "
                        "you name",
                        dir, r->valueint);
    } else if (m) {
        prev_close(&m, &tx, sp);
        TPS_FAIL_IF(!o->force, ctx, TPS_E_EXISTS,
                    "%s: already holds a tpshard output; pass --force to replace it", dir);
        remove_output(dir);
    }
out:
    if (lfd >= 0) close(lfd);
    return rc;
}

tps_err tps_sp_prepare_dir(engine *E, const tps_split_opts *o)
{
    tps_ctx *ctx = E->ctx;
    const tps_ckpt *ck = E->ck;
    const char *dir = o->out_dir;
    if (!tps_exists(dir)) {
        /* mkdir -p */
        char *p = tps_strdup(dir);
        if (!p) return tps_fail(ctx, TPS_E_NOMEM, "out of memory");
        for (char *s = p + 1; *s; s++)
            if (*s == '/') {
                *s = 0;
                mkdir(p, 0755);
                *s = '/';
            }
        int ok = mkdir(p, 0755) == 0 || errno == EEXIST;
        int e = errno;
        free(p);
        if (!ok) return tps_fail(ctx, TPS_E_IO, "%s: cannot create the output directory: %s", dir, strerror(e));
    }
    if (!tps_is_dir(dir)) return tps_fail(ctx, TPS_E_EXISTS, "%s: exists and is not a directory", dir);
    char *a = realpath(dir, NULL), *b = realpath(ck->dir, NULL);
    int same = a && b && strcmp(a, b) == 0;
    free(a);
    free(b);
    if (same)
        return tps_fail(ctx, TPS_E_ARG,
                        "%s: the output directory is the model directory itself; choose another -o",
                        dir);
    /* Before anything in it is looked at: another split that made it a
     * moment ago, or is writing into it, is not ours to race. */
    tps_err rc = TPS_OK;
    E->wfd = tps_out_claim(ctx, dir, E->join, &rc);
    if (rc) return rc;
    /* --ranks into a directory other --ranks runs of the same split fill:
     * add to it, and leave their ranks alone. */
    if (E->join) return prepare_join(E, o);
    DIR *d = opendir(dir);
    if (!d) return tps_fail(ctx, TPS_E_IO, "%s: %s", dir, strerror(errno));
    int found = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (is_ours(de->d_name) == 1) found = 1;
    closedir(d);
    if (found && !o->force)
        return tps_fail(ctx, TPS_E_EXISTS,
                        "%s: already holds a tpshard output; pass --force to replace it", dir);
    return TPS_OK;
}

/* After the new files are in place: remove rank files of an older output
 * that the new one does not have, and stale temporaries of killed runs. */
void tps_sp_remove_stale(engine *E, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        int kind = is_ours(de->d_name);
        if (!kind || strcmp(de->d_name, TPS_MANIFEST) == 0) continue;
        char *p = tps_path_join(dir, de->d_name);
        int keep = 0, r = rank_of(E, de->d_name);
        /* Joining: other runs' ranks and temporaries are theirs. */
        if (E->join && (r < 0 || r >= E->nranks || !E->write[r])) keep = 1;
        for (size_t i = 0; p && i < E->nfiles && !keep; i++)
            keep = strcmp(E->files[i].final, p) == 0 || strcmp(E->files[i].tmp, p) == 0;
        if (p && !keep) unlink(p);
        free(p);
    }
    closedir(d);
}

tps_err tps_sp_space_check(tps_ctx *ctx, const engine *E, const char *dir)
{
    struct statvfs sv;
    if (statvfs(dir, &sv) != 0) return TPS_OK;
    uint64_t need = 0, replaced = 0;
    for (size_t i = 0; i < E->nfiles; i++) {
        need += E->files[i].size;
        struct stat sb;
        if (stat(E->files[i].final, &sb) == 0) replaced += (uint64_t)sb.st_size;
    }
    /* blocks shared with the source take no space (with --copy they are written all the same) */
    if (E->kc.mode == TPS_KC_CLONE) need -= E->shareable < need ? E->shareable : need;
    uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize + replaced;
    if (need > avail)
        return tps_fail(ctx, TPS_E_NOSPACE,
                        "%s: not enough free space: the split needs %.2f GiB, %.2f GiB are free", dir,
                        need / 1073741824.0, avail / 1073741824.0);
    return TPS_OK;
}

/* Other runs, here or on other machines, may write the manifest too:
 * take the lock, re-read theirs as it is now, add ours. */
tps_err tps_sp_record_manifest(engine *E, const tps_split_opts *o, const char *plan_source)
{
    tps_ctx *ctx = E->ctx;
    tps_err rc = TPS_OK;
    int lfd = E->join ? lock_dir(ctx, o->out_dir) : -1;
    if (E->join) {
        tps_sp_prev_close(E);
        if (load_manifest(ctx, o->out_dir, &E->prev, &E->prev_text, E->prev_sp) != TPS_OK ||
            !E->prev) {
            tps_sp_prev_close(E); /* unreadable or gone: ours alone */
        } else if (!joinable(E, E->prev, E->prev_sp)) {
            tps_sp_prev_close(E);
            rc = tps_fail(ctx, TPS_E_EXISTS,
                          "%s: another split (other source, plan, layout or tp) wrote its "
                          "manifest here while this run was writing; this run's rank files "
                          "are not recorded",
                          o->out_dir);
        }
    }
    if (!rc)
        rc = tps_sp_write_manifest(E, o, plan_source);
    if (lfd >= 0) close(lfd);
    return rc;
}
