/* locate.c - what a MODEL argument names.
 *
 * MODEL may be a path, a folder of the Hugging Face cache (a repo's
 * models--org--name/, read through refs/main, or one of its snapshots), or a
 * repo id (org/name) found in the local cache. Nothing is ever downloaded.
 * A model from the cache is named after its repo, not its revision hash, and
 * its default split output goes to the current directory, not into the
 * cache.
 * What a file that is not safetensors is: common/sniff.c. */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------ the Hugging Face cache */

/* The hub cache directory, as huggingface_hub finds it (malloc'd). */
static char *hub_root(void)
{
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v) return tps_strdup(v);
    if ((v = getenv("HUGGINGFACE_HUB_CACHE")) && *v) return tps_strdup(v);
    if ((v = getenv("HF_HOME")) && *v) return tps_path_join(v, "hub");
    if ((v = getenv("XDG_CACHE_HOME")) && *v) return tps_asprintf("%s/huggingface/hub", v);
    if ((v = getenv("HOME")) && *v) return tps_asprintf("%s/.cache/huggingface/hub", v);
    return NULL;
}

/* "models--org--name" -> "name" (malloc'd), NULL when it is no repo folder. */
static char *repo_name_of(const char *folder)
{
    if (strncmp(folder, "models--", 8) != 0 || !folder[8]) return NULL;
    const char *name = folder + 8, *sep = strstr(name, "--");
    if (sep) name = sep + 2;
    return *name && !strchr(name, '/') ? tps_strdup(name) : NULL;
}

/* org/name or name: the characters a Hub repo id may hold. */
static int is_repo_id(const char *s)
{
    int slashes = 0;
    const char *part = s;
    for (const char *c = s;; c++) {
        if (*c == '/' || !*c) {
            if (c == part || *part == '.' || *part == '-') return 0;
            if (!*c) break;
            if (++slashes > 1) return 0;
            part = c + 1;
            continue;
        }
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '-' || *c == '_' || *c == '.'))
            return 0;
    }
    return strstr(s, "--") == NULL && strstr(s, "..") == NULL;
}

/* A repo folder: its snapshot for refs/main (or its only snapshot). */
static tps_err repo_snapshot(tps_ctx *ctx, const char *repo, const char *shown, char **path)
{
    tps_err rc = TPS_OK;
    char *ref = tps_asprintf("%s/refs/main", repo), *rev = NULL, *snaps = tps_path_join(repo, "snapshots");
    size_t len = 0;
    TPS_FAIL_IF(!ref || !snaps, ctx, TPS_E_NOMEM, "out of memory");
    if (tps_exists(ref)) {
        TPS_CHECK(tps_read_file(ctx, ref, 4096, &rev, &len));
        while (len && (rev[len - 1] == '\n' || rev[len - 1] == '\r' || rev[len - 1] == ' ')) rev[--len] = 0;
        TPS_FAIL_IF(!len || strchr(rev, '/') || !strcmp(rev, "..") || !strcmp(rev, "."), ctx,
                    TPS_E_FORMAT, "%s: not a revision", ref);
        *path = tps_asprintf("%s/%s", snaps, rev);
        TPS_FAIL_IF(!*path, ctx, TPS_E_NOMEM, "out of memory");
        TPS_FAIL_IF(!tps_is_dir(*path), ctx, TPS_E_IO,
                    "%s: refs/main names revision %s, which is not in %s; tpshard does not download: "
                    "fetch it with `huggingface-cli download %s`",
                    shown, rev, snaps, shown);
    } else {
        /* No refs/main (a download by revision): its only snapshot. */
        DIR *d = opendir(snaps);
        TPS_FAIL_IF(!d, ctx, TPS_E_IO, "%s: a Hugging Face cache folder without snapshots/", shown);
        struct dirent *de;
        int n = 0;
        while ((de = readdir(d)))
            if (de->d_name[0] != '.') {
                n++;
                free(rev);
                rev = tps_strdup(de->d_name);
            }
        closedir(d);
        TPS_FAIL_IF(n != 1, ctx, TPS_E_IO,
                    "%s: a Hugging Face cache folder without refs/main and with %d snapshots; pass "
                    "one: %s/<revision>",
                    shown, n, snaps);
        *path = rev ? tps_asprintf("%s/%s", snaps, rev) : NULL;
        TPS_FAIL_IF(!*path, ctx, TPS_E_NOMEM, "out of memory");
    }
out:
    free(ref);
    free(rev);
    free(snaps);
    return rc;
}

/* A directory inside the cache, .../models--org--name/snapshots/<rev>: the
 * repo's name, else NULL. */
static char *snapshot_repo(const char *dir)
{
    char *real = realpath(dir, NULL), *name = NULL;
    if (!real) return NULL;
    char *rev = strrchr(real, '/');
    if (rev && rev != real) {
        *rev = 0;
        char *snaps = strrchr(real, '/');
        if (snaps && !strcmp(snaps + 1, "snapshots")) {
            *snaps = 0;
            char *repo = strrchr(real, '/');
            if (repo) name = repo_name_of(repo + 1);
        }
    }
    free(real);
    return name;
}

tps_err tps_model_locate(tps_ctx *ctx, const char *arg, char **path, char **repo)
{
    *path = NULL;
    *repo = NULL;
    tps_err rc = TPS_OK;
    char *root = NULL, *folder = NULL, *tmp = NULL;
    struct stat sb;
    if (stat(arg, &sb) == 0) {
        char *copy = tps_strdup(arg);
        TPS_FAIL_IF(!copy, ctx, TPS_E_NOMEM, "out of memory");
        size_t l = strlen(copy);
        while (l > 1 && copy[l - 1] == '/') copy[--l] = 0;
        char *name = S_ISDIR(sb.st_mode) ? repo_name_of(basename(copy)) : NULL;
        free(copy);
        if (name && (tmp = tps_path_join(arg, "snapshots")) && tps_is_dir(tmp)) {
            *repo = name;
            TPS_CHECK(repo_snapshot(ctx, arg, arg, path));
            goto out;
        }
        free(name);
        *path = tps_strdup(arg);
        TPS_FAIL_IF(!*path, ctx, TPS_E_NOMEM, "out of memory");
        /* A file: its directory (the file itself links into blobs/). */
        free(tmp);
        tmp = tps_strdup(arg);
        TPS_FAIL_IF(!tmp, ctx, TPS_E_NOMEM, "out of memory");
        *repo = snapshot_repo(S_ISDIR(sb.st_mode) ? tmp : dirname(tmp));
        goto out;
    }
    int e = errno;
    TPS_FAIL_IF(e != ENOENT || !is_repo_id(arg), ctx, TPS_E_IO, "%s: %s", arg, strerror(e));
    root = hub_root();
    /* org/name -> models--org--name */
    const char *slash = strchr(arg, '/');
    folder = !root ? NULL
             : slash ? tps_asprintf("%s/models--%.*s--%s", root, (int)(slash - arg), arg, slash + 1)
                     : tps_asprintf("%s/models--%s", root, arg);
    if (folder && tps_is_dir(folder)) {
        *repo = repo_name_of(strrchr(folder, '/') + 1);
        TPS_FAIL_IF(!*repo, ctx, TPS_E_NOMEM, "out of memory");
        TPS_CHECK(repo_snapshot(ctx, folder, arg, path));
        goto out;
    }
    if (!strchr(arg, '/')) { /* a bare name: most likely a path mistyped */
        rc = tps_fail(ctx, TPS_E_IO, "%s: %s", arg, strerror(e));
        goto out;
    }
    rc = tps_fail(ctx, TPS_E_IO,
                  "%s: no such file or directory, nor a model in the Hugging Face cache (%s); "
                  "tpshard reads the local cache and does not download: fetch it with "
                  "`huggingface-cli download %s` (or `hf download %s`), then run this again",
                  arg, root ? root : "HF_HUB_CACHE unset and no HOME", arg, arg);
out:
    free(root);
    free(folder);
    free(tmp);
    if (rc) {
        free(*path);
        free(*repo);
        *path = *repo = NULL;
    }
    return rc;
}
