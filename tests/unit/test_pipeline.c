/* test_pipeline.c - split --pp: the stages' layers (vLLM's get_pp_indices,
 * --pp-layers lists) and the rank file names of the workers. */
#include <string.h>

#include "test.h"
#include "tpshard.h"

static int same(const int *a, const int *b, int n) { return !memcmp(a, b, sizeof *a * (size_t)n); }

/* The values vLLM 0.33's get_pp_indices gives (distributed/utils.py). */
static void default_partition_is_vllms(void)
{
    static const struct {
        int layers, pp, want[4];
    } cases[] = {{5, 2, {3, 2}},       {7, 3, {2, 3, 2}},        {4, 3, {1, 2, 1}},
                 {61, 4, {15, 15, 16, 15}}, {8, 4, {2, 2, 2, 2}}, {3, 3, {1, 1, 1}},
                 {62, 4, {15, 16, 16, 15}}, {2, 1, {2}}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got[4] = {0};
        tps_pp_default_partition(cases[i].layers, cases[i].pp, got);
        CHECK_MSG(same(got, cases[i].want, cases[i].pp), "%d layers over %d: %d,%d,%d,%d",
                  cases[i].layers, cases[i].pp, got[0], got[1], got[2], got[3]);
    }
    /* every count and stage count: sums to the layers, the last never larger */
    for (int l = 1; l <= 40; l++)
        for (int pp = 1; pp <= l && pp <= 8; pp++) {
            int got[8], sum = 0;
            tps_pp_default_partition(l, pp, got);
            for (int s = 0; s < pp; s++) sum += got[s];
            CHECK_MSG(sum == l && got[pp - 1] == l / pp, "%d layers over %d", l, pp);
        }
}

static void layer_lists(void)
{
    int out[4];
    char why[160];
    CHECK(tps_pp_parse_layers("15,15,16,15", 4, out, why, sizeof why) == 0 &&
          same(out, (int[]){15, 15, 16, 15}, 4));
    CHECK(tps_pp_parse_layers("3,0", 2, out, why, sizeof why) == -1 && strstr(why, "stage 1"));
    CHECK(tps_pp_parse_layers("1,2,3", 2, out, why, sizeof why) == -1 && strstr(why, "3 stages"));
    CHECK(tps_pp_parse_layers("1,x", 2, out, why, sizeof why) == -1);
    CHECK(tps_pp_parse_layers("1,", 2, out, why, sizeof why) == -1);
    CHECK(tps_pp_parse_layers("", 1, out, why, sizeof why) == -1);
    CHECK(tps_pp_parse_layers("-1,2", 2, out, why, sizeof why) == -1);
}

static void file_names(void)
{
    char b[96];
    int r, p;
    tps_rank_file_name(8, 1, 5, 0, b, sizeof b);
    CHECK(!strcmp(b, "model-rank-5-part-0.safetensors"));
    tps_rank_file_name(8, 2, 13, 2, b, sizeof b);
    CHECK(!strcmp(b, "model-pp-1-tp-5-part-2.safetensors"));
    tps_rank_file_name(1, 3, 2, 0, b, sizeof b);
    CHECK(!strcmp(b, "model-pp-2-tp-0-part-0.safetensors"));
    CHECK(tps_rank_file_parse("model-pp-1-tp-5-part-2.safetensors", 8, 2, &r, &p) > 0 && r == 13 &&
          p == 2);
    CHECK(tps_rank_file_parse("model-pp-2-tp-0-part-0.safetensors", 8, 2, &r, &p) < 0);
    CHECK(tps_rank_file_parse("model-pp-0-tp-8-part-0.safetensors", 8, 2, &r, &p) < 0);
    CHECK(tps_rank_file_parse("model-rank-3-part-1.safetensors", 8, 2, &r, &p) < 0);
    CHECK(tps_rank_file_parse("model-rank-3-part-1.safetensors", 8, 1, &r, &p) > 0 && r == 3 &&
          p == 1);
}

int main(void)
{
    RUN(default_partition_is_vllms);
    RUN(layer_lists);
    RUN(file_names);
    TEST_EXIT();
}
