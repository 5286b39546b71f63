# tpshard - GNU make. Knobs (override on the command line):
CUDA     ?= 0
OPENMP   ?= 1
DEBUG    ?= 0
SANITIZE ?=
MPI      ?= 0
PREFIX   ?= /usr/local
DESTDIR  ?=
CUDA_HOME ?= /usr/local/cuda
NCCL_HOME ?= $(CUDA_HOME)
CC       ?= cc
NVCC     ?= $(CUDA_HOME)/bin/nvcc

# Build dependencies, found with pkg-config. Their flags live in build/deps.mk,
# which is made before anything else: its recipe first runs tools/deps.sh
# (installs what is missing when root, else stops with the apt-get line), and
# GNU make then reads itself again with the flags of the packages just
# installed. PKG_CFLAGS and PKG_LIBS given on the command line skip all of it
# (a machine with the libraries outside pkg-config's reach).
PKGS := libcjson yaml-0.1 zlib
NODEPS_GOALS := clean uninstall check-deps
ifneq ($(origin PKG_LIBS),command line)
ifneq ($(filter-out $(NODEPS_GOALS),$(or $(MAKECMDGOALS),all)),)
include build/deps.mk
endif
endif

CFLAGS  ?= $(if $(filter 1,$(DEBUG)),-O0 -g3,-O2 -g)
CFLAGS  += -std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Wall -Wextra -Wshadow -Wno-unused-parameter \
           -Ilib $(PKG_CFLAGS)
LDLIBS  += $(PKG_LIBS) -lm -lpthread
ifeq ($(OPENMP),1)
CFLAGS  += -fopenmp
LDFLAGS += -fopenmp
else
CFLAGS  += -Wno-unknown-pragmas
endif
ifneq ($(SANITIZE),)
CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SANITIZE)
endif

# lib/ by stage (see lib/README.md): common/ <- model/ <- quant/ <- plan/ <- layout/ <- split/, verify/ <- front/.
# The generated plan and layout tables sit in lib/ itself.
LIB_DIRS := common model quant plan layout split verify front
LIB_SRCS := $(filter-out lib/verify/verify_cuda_stub.c lib/%_gen.c,$(wildcard lib/*.c $(LIB_DIRS:%=lib/%/*.c))) \
            lib/plans_gen.c lib/layouts_gen.c
LIB_SRCS := $(sort $(LIB_SRCS))
# ar keeps one member per file name: two lib/ sources of one name would drop one silently.
LIB_DUPS := $(strip $(foreach n,$(sort $(notdir $(LIB_SRCS))),$(if $(filter-out 1,$(words $(filter %/$(n),$(LIB_SRCS)))),$(n))))
ifneq ($(LIB_DUPS),)
$(error lib/ has two sources named $(LIB_DUPS): the static library keeps one member per name)
endif
ifeq ($(CUDA),1)
CFLAGS   += -DTPS_WITH_CUDA -I$(CUDA_HOME)/include -I$(NCCL_HOME)/include
LDLIBS   += -L$(CUDA_HOME)/lib64 -L$(NCCL_HOME)/lib -lcudart -lcublas -lnccl -lstdc++ \
            -Wl,-rpath,$(CUDA_HOME)/lib64 -Wl,-rpath,$(NCCL_HOME)/lib
CUDA_SRCS := $(wildcard lib/verify/*.cu)
CUDA_OBJS := $(patsubst %.cu,build/%.o,$(CUDA_SRCS))
else
LIB_SRCS += lib/verify/verify_cuda_stub.c
CUDA_OBJS :=
endif
LIB_OBJS := $(patsubst %.c,build/%.o,$(LIB_SRCS)) $(CUDA_OBJS)
# The same library position-independent, for libtpshard.so (the Python module loads it).
PIC_OBJS := $(patsubst %.c,build/pic/%.o,$(LIB_SRCS)) $(CUDA_OBJS)
CMD_SRCS := $(wildcard cmd/*.c)
CMD_OBJS := $(patsubst %.c,build/%.o,$(CMD_SRCS))
TEST_SRCS := $(wildcard tests/unit/test_*.c)
TEST_BINS := $(patsubst tests/unit/%.c,build/tests/%,$(TEST_SRCS))
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_REPLAY := $(patsubst tests/fuzz/%.c,build/tests/replay_%,$(FUZZ_SRCS))
PLANS := $(sort $(wildcard plans/*.yaml))
LAYOUTS := $(sort $(wildcard plans/layouts/*.yaml))
BUILD_FLAGS := $(CUDA)|$(OPENMP)|$(DEBUG)|$(SANITIZE)|$(CC)

.PHONY: all lib test check-deps deps demo install uninstall clean fuzz test-valgrind bench tests-bin \
  wheel test-engines
all: tpshard

check-deps:
	@sh tools/deps.sh

build/deps.mk: tools/deps.sh
	@sh tools/deps.sh
	@mkdir -p build
	@pkg-config --cflags $(PKGS) >/dev/null && { \
	  echo "PKG_CFLAGS := $$(pkg-config --cflags $(PKGS))"; \
	  echo "PKG_LIBS := $$(pkg-config --libs $(PKGS))"; } >$@.tmp && mv $@.tmp $@

# Rebuild everything when the knobs change.
build/.flags: FORCE
	@mkdir -p build; echo '$(BUILD_FLAGS)' | cmp -s - $@ || echo '$(BUILD_FLAGS)' > $@
FORCE:

lib/plans_gen.c: $(PLANS) tools/embed.sh
	sh tools/embed.sh $(PLANS) > $@.tmp && mv $@.tmp $@

lib/layouts_gen.c: $(LAYOUTS) tools/embed.sh
	sh tools/embed.sh --table tps_builtin_layouts $(LAYOUTS) > $@.tmp && mv $@.tmp $@

HEADERS := $(wildcard lib/*.h $(LIB_DIRS:%=lib/%/*.h) cmd/*.h)

build/%.o: %.c $(HEADERS) build/.flags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

build/pic/%.o: %.c $(HEADERS) build/.flags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

build/lib/verify/%.o: lib/verify/%.cu $(HEADERS) build/.flags
	@mkdir -p $(dir $@)
	$(NVCC) -O2 -std=c++17 -Ilib $(PKG_CFLAGS) -I$(NCCL_HOME)/include -Xcompiler -fPIC \
	  -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 -c $< -o $@

libtpshard.a: $(LIB_OBJS)
	rm -f $@; ar rcs $@ $^

tpshard: $(CMD_OBJS) libtpshard.a
	$(CC) $(LDFLAGS) -o $@ $(CMD_OBJS) libtpshard.a $(LDLIBS)

libtpshard.so: $(PIC_OBJS)
	$(CC) -shared $(LDFLAGS) -o $@ $(PIC_OBJS) $(LDLIBS)

# The Python wheel (python/): tpshard, libtpshard.so and the man pages, built
# from a copy of these sources with the default knobs whatever this tree's
# (no sanitizers), their shared libraries bundled by auditwheel. Its build
# tools come from PyPI into build/wheelenv once. Result: build/wheel/dist/.
WHEEL_INPUTS := $(filter-out lib/%_gen.c,$(wildcard lib/*.c lib/*.h $(foreach d,$(LIB_DIRS),lib/$(d)/*.c lib/$(d)/*.h lib/$(d)/*.cu))) \
  $(wildcard cmd/*.c cmd/*.h man/*.1 man/*.5 python/*.* python/tpshard/*.py) $(PLANS) $(LAYOUTS) \
  Makefile tools/wheel.sh tools/embed.sh tools/deps.sh
build/wheel/stamp: $(WHEEL_INPUTS)
	@sh tools/wheel.sh
wheel: build/wheel/stamp

build/tests/%: tests/unit/%.c tests/unit/test.h libtpshard.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit $(LDFLAGS) -o $@ $< libtpshard.a $(LDLIBS)

build/tests/replay_%: tests/fuzz/%.c tests/fuzz/replay.c tests/fuzz/fuzz_common.h libtpshard.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< tests/fuzz/replay.c libtpshard.a $(LDLIBS)

build/gen_llama: bench/gen_llama.c
	@mkdir -p build
	$(CC) -O2 -std=c11 -Wall -Wextra -o $@ $<

build/tests/peakrss: tests/util/peakrss.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -std=c11 -Wall -Wextra -o $@ $<

tests-bin: tpshard $(TEST_BINS) $(FUZZ_REPLAY) build/gen_llama build/tests/peakrss

# The README's test command. Ends with one line "N passed, M failed".
test: tests-bin
	@sh tools/deps.sh test
	@TPS_SANITIZE="$(SANITIZE)" sh tests/run.sh

# Opt-in, never in CI: tpshard's serving layouts against vLLM 0.33.0 and SGLang
# 0.5.23 themselves, run on the CPU (tests/engines/README.md). Installs both
# engines into build/engines-venv from PyPI the first time (~6 GB).
# Ends with one line "N passed, M failed".
test-engines: tpshard
	@sh tests/py/venv.sh
	@sh tests/engines/install.sh
	@build/venv/bin/python tests/engines/run.py $(ENGINES_ARGS)

test-valgrind: tests-bin
	@VALGRIND=1 sh tests/run.sh cli

FUZZ_SECONDS ?= 60
fuzz: check-deps
	@sh tests/fuzz/run.sh $(FUZZ_SECONDS)

demo: all
	@sh tools/demo.sh

bench: all
	@sh bench/split.sh

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include \
	  $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5 \
	  $(DESTDIR)$(PREFIX)/share/tpshard/schema
	install -m 755 tpshard $(DESTDIR)$(PREFIX)/bin/tpshard
	install -m 644 libtpshard.a $(DESTDIR)$(PREFIX)/lib/libtpshard.a
	install -m 644 lib/tpshard.h $(DESTDIR)$(PREFIX)/include/tpshard.h
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(shell sed -n 's/.*TPS_VERSION_STRING "\(.*\)"/\1/p' lib/tpshard.h)|' \
	  -e 's|@LIBS@|$(PKG_LIBS) $(if $(filter 1,$(OPENMP)),-fopenmp) -lm -lpthread|' tools/tpshard.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/tpshard.pc
	for f in man/*.1; do [ -f "$$f" ] && install -m 644 $$f $(DESTDIR)$(PREFIX)/share/man/man1/; done; true
	for f in man/*.5; do [ -f "$$f" ] && install -m 644 $$f $(DESTDIR)$(PREFIX)/share/man/man5/; done; true
	install -m 644 docs/schema/*.schema.json $(DESTDIR)$(PREFIX)/share/tpshard/schema/

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/tpshard $(DESTDIR)$(PREFIX)/lib/libtpshard.a \
	  $(DESTDIR)$(PREFIX)/include/tpshard.h $(DESTDIR)$(PREFIX)/lib/pkgconfig/tpshard.pc
	for f in man/*.1; do rm -f $(DESTDIR)$(PREFIX)/share/man/man1/$$(basename $$f); done
	for f in man/*.5; do rm -f $(DESTDIR)$(PREFIX)/share/man/man5/$$(basename $$f); done
	for f in docs/schema/*.schema.json; do rm -f $(DESTDIR)$(PREFIX)/share/tpshard/schema/$$(basename $$f); done
	rmdir $(DESTDIR)$(PREFIX)/share/tpshard/schema $(DESTDIR)$(PREFIX)/share/tpshard 2>/dev/null || true

clean:
	rm -rf build tpshard libtpshard.a libtpshard.so lib/plans_gen.c lib/layouts_gen.c
