/* sniff.c - what a file that is not safetensors is. A file given as, or
 * found in place of, safetensors is recognised by its first bytes (zip and
 * pickle magic: a PyTorch checkpoint; JSON: a config or an index given
 * instead of the directory; GGUF), so the error says what it is and what to
 * do rather than which header length did not fit. */
#include "internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char convert_hint[] =
    "tpshard reads safetensors only: convert it first, for a transformers model with "
    "python -c \"from transformers import AutoModelForCausalLM as M; "
    "M.from_pretrained('%s').save_pretrained('%s-safetensors', safe_serialization=True)\", "
    "or for a file of tensors with python -c \"import torch, safetensors.torch as s; "
    "s.save_file(torch.load('%s'), 'model.safetensors')\"";

/* What the first bytes say a file is, when it is surely not safetensors:
 * "zip", "pickle", "json", "gguf", or NULL. */
static const char *kind_of(const unsigned char *b, size_t got, uint64_t size)
{
    if (got >= 4 && !memcmp(b, "GGUF", 4)) return "gguf";
    if (got >= 9 && !memcmp(b, "PK\3\4", 4) && (!b[8] || !strchr("{ \t\r\n", b[8]))) return "zip";
    /* The rest only where the 8-byte header length cannot hold. */
    uint64_t n = 0;
    for (int i = got >= 8 ? 7 : -1; i >= 0; i--) n = (n << 8) | b[i];
    if (got >= 8 && n <= 100000000u && 8 + n <= size) return NULL; /* safetensors.c's limit */
    if (got >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5) return "pickle";
    size_t i = 0;
    while (i < got && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t')) i++;
    if (i < got && (b[i] == '{' || b[i] == '[')) return "json";
    return NULL;
}

int tps_sniff(const char *path, const unsigned char *b, size_t got, uint64_t size, char *msg,
              size_t len)
{
    const char *k = kind_of(b, got, size);
    if (!k) return 0;
    char *c1 = tps_strdup(path), *c2 = tps_strdup(path);
    const char *dir = c1 ? dirname(c1) : ".", *base = c2 ? basename(c2) : path;
    if (!strcmp(k, "zip") || !strcmp(k, "pickle")) {
        char hint[1024];
        snprintf(hint, sizeof hint, convert_hint, dir, dir, path);
        snprintf(msg, len, "%s: a PyTorch checkpoint (%s), not a safetensors file; %s", path,
                 !strcmp(k, "zip") ? "a torch.save zip archive" : "a Python pickle, as torch.save wrote before 1.6",
                 hint);
    } else if (!strcmp(k, "gguf")) {
        snprintf(msg, len,
                 "%s: a GGUF file (llama.cpp), not a safetensors file; tpshard reads Hugging Face "
                 "safetensors checkpoints",
                 path);
    } else {
        const char *what = !strcmp(base, "config.json") ? "the model's config.json"
                           : strstr(base, ".index.json") ? "the index of a sharded checkpoint"
                           : !strcmp(base, TPS_MANIFEST) ? "a tpshard manifest"
                                                         : "a JSON file";
        snprintf(msg, len, "%s: %s, not a safetensors file; pass the directory instead: %s", path,
                 what, dir);
    }
    free(c1);
    free(c2);
    return 1;
}

tps_err tps_no_model_here(tps_ctx *ctx, const char *dir)
{
    DIR *d = opendir(dir);
    char msg[2048] = "", other[256] = "";
    int nst = 0;
    if (d) {
        struct dirent *de;
        for (int seen = 0; (de = readdir(d)) && seen < 4096 && !*msg; seen++) {
            if (de->d_name[0] == '.') continue;
            size_t l = strlen(de->d_name);
            if (l > 12 && !strcmp(de->d_name + l - 12, ".safetensors")) {
                if (!nst++) snprintf(other, sizeof other, "%s", de->d_name);
                continue;
            }
            char *p = tps_path_join(dir, de->d_name);
            int fd = p ? open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK) : -1;
            struct stat sb;
            unsigned char b[16];
            if (fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
                ssize_t got = pread(fd, b, sizeof b, 0);
                const char *k = got > 0 ? kind_of(b, (size_t)got, (uint64_t)sb.st_size) : NULL;
                if (k && (!strcmp(k, "zip") || !strcmp(k, "pickle"))) {
                    char hint[1024];
                    snprintf(hint, sizeof hint, convert_hint, dir, dir, p);
                    snprintf(msg, sizeof msg,
                             "%s: holds a PyTorch checkpoint (%s, %s) and no model.safetensors or "
                             "model.safetensors.index.json; %s",
                             dir, de->d_name, !strcmp(k, "zip") ? "a torch.save zip archive" : "a Python pickle",
                             hint);
                }
            }
            if (fd >= 0) close(fd);
            free(p);
        }
        closedir(d);
    }
    if (*msg) return tps_fail(ctx, TPS_E_FORMAT, "%s", msg);
    if (nst == 1)
        return tps_fail(ctx, TPS_E_IO,
                        "%s: no model.safetensors, model.safetensors.index.json or %s in this "
                        "directory; it holds %s: pass that file",
                        dir, TPS_MANIFEST, other);
    if (nst > 1)
        return tps_fail(ctx, TPS_E_IO,
                        "%s: no model.safetensors, model.safetensors.index.json or %s in this "
                        "directory; it holds %d .safetensors files (%s...) but no index naming "
                        "them",
                        dir, TPS_MANIFEST, nst, other);
    return tps_fail(ctx, TPS_E_IO,
                    "%s: no model.safetensors, model.safetensors.index.json or %s in this directory",
                    dir, TPS_MANIFEST);
}
