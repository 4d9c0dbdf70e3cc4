// pytorch_pattern drives libvmmalloc.so the way PyTorch (or torch_npu)
// does, over a test double of the vendor library, and checks what it gets
// back. It is compiled and run by the Go tests (cabi_test.go):
//
//   pytorch_pattern cuda|acl SNAPSHOT_PATH
//
// with LD_LIBRARY_PATH holding libvmmalloc.so and the double
// (libcuda.so.1 or libascendcl.so). It loads both by name with dlopen, as
// torch's loader does; it plays the framework's runtime itself (contexts,
// streams) through the double. Device memory of the doubles is host
// memory, so contents are checked by reading the pointers. It prints one
// "ok: ..." line per check and "PASS" at the end; a failed check prints
// "FAIL: ..." and exits 1.

#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vmmalloc.h"

#define MIB (1ull << 20)
#define CHECK(cond, ...)                                                    \
	do {                                                                    \
		if (!(cond)) {                                                      \
			fprintf(stdout, "FAIL: %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stdout, __VA_ARGS__);                                   \
			fprintf(stdout, " (last error: %s)\n", last_error());           \
			exit(1);                                                        \
		}                                                                   \
	} while (0)

// ---- the library, by name ----
static void *(*v_alloc)(size_t, int, void *);
static void (*v_free)(void *, size_t, int, void *);
static void (*v_init)(int);
static void (*v_reset)(void);
static void (*v_memory_fraction)(double, int);
static void (*v_record_stream)(void *, void *);
static int (*v_record_stream_checked)(void *, void *);
static int (*v_empty_cache)(int);
static int (*v_set_memory_fraction)(double, int);
static int (*v_begin)(int, uint64_t, uint64_t);
static int (*v_end)(int, uint64_t, uint64_t);
static int (*v_release)(int, uint64_t, uint64_t);
static int (*v_sleep)(int, uint64_t, uint64_t, int, int);
static int (*v_wake)(int, uint64_t, uint64_t);
static size_t (*v_stats_json)(int, char *, size_t);
static int (*v_record_history)(int, size_t);
static int (*v_snapshot)(const char *);
static size_t (*v_last_error)(char *, size_t);

static const char *last_error(void) {
	static char buf[4096];
	if (!v_last_error)
		return "(not loaded)";
	v_last_error(buf, sizeof buf);
	return buf;
}

static void *sym(void *h, const char *name) {
	void *p = dlsym(h, name);
	if (!p) {
		printf("FAIL: dlsym %s: %s\n", name, dlerror());
		exit(1);
	}
	return p;
}

static void load_library(void) {
	void *h = dlopen("libvmmalloc.so", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		printf("FAIL: dlopen libvmmalloc.so: %s\n", dlerror());
		exit(1);
	}
	v_alloc = sym(h, "vmmalloc_alloc");
	v_free = sym(h, "vmmalloc_free");
	v_init = sym(h, "vmmalloc_init");
	v_reset = sym(h, "vmmalloc_reset");
	v_memory_fraction = sym(h, "vmmalloc_memory_fraction");
	v_record_stream = sym(h, "vmmalloc_record_stream");
	v_record_stream_checked = sym(h, "vmmalloc_record_stream_checked");
	v_empty_cache = sym(h, "vmmalloc_empty_cache");
	v_set_memory_fraction = sym(h, "vmmalloc_set_memory_fraction");
	v_begin = sym(h, "vmmalloc_begin_allocate_to_pool");
	v_end = sym(h, "vmmalloc_end_allocate_to_pool");
	v_release = sym(h, "vmmalloc_release_pool");
	v_sleep = sym(h, "vmmalloc_sleep");
	v_wake = sym(h, "vmmalloc_wake");
	v_stats_json = sym(h, "vmmalloc_stats_json");
	v_record_history = sym(h, "vmmalloc_record_history");
	v_snapshot = sym(h, "vmmalloc_snapshot");
	v_last_error = sym(h, "vmmalloc_last_error");
}

// ---- the framework's runtime, played through the double ----
static int use_acl;
static int (*cu_init)(unsigned);
static int (*cu_device_get)(int *, int);
static int (*cu_retain)(void **, int);
static int (*cu_set_current)(void *);
static int (*cu_stream_create)(void **, unsigned);
static int (*acl_init)(const char *);
static int (*acl_set_device)(int);
static int (*acl_create_stream)(void **);
static void *primary[2];

static void load_runtime(void) {
	if (use_acl) {
		void *h = dlopen("libascendcl.so", RTLD_NOW | RTLD_GLOBAL);
		CHECK(h, "dlopen libascendcl.so: %s", dlerror());
		acl_init = sym(h, "aclInit");
		acl_set_device = sym(h, "aclrtSetDevice");
		acl_create_stream = sym(h, "aclrtCreateStream");
		int rc = acl_init(NULL);
		CHECK(rc == 0, "aclInit %d", rc);
		return;
	}
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	CHECK(h, "dlopen libcuda.so.1: %s", dlerror());
	cu_init = sym(h, "cuInit");
	cu_device_get = sym(h, "cuDeviceGet");
	cu_retain = sym(h, "cuDevicePrimaryCtxRetain");
	cu_set_current = sym(h, "cuCtxSetCurrent");
	cu_stream_create = sym(h, "cuStreamCreate");
	CHECK(cu_init(0) == 0, "cuInit");
	for (int d = 0; d < 2; d++) {
		int dev;
		CHECK(cu_device_get(&dev, d) == 0, "cuDeviceGet");
		CHECK(cu_retain(&primary[d], dev) == 0, "cuDevicePrimaryCtxRetain");
	}
}

// set_device makes device d current on the calling thread (cudaSetDevice,
// torch.npu.set_device).
static void set_device(int d) {
	if (use_acl)
		CHECK(acl_set_device(d) == 0, "aclrtSetDevice(%d)", d);
	else
		CHECK(cu_set_current(primary[d]) == 0, "cuCtxSetCurrent(%d)", d);
}

// new_stream creates a stream on the current device (cudaStreamCreate).
static void *new_stream(void) {
	void *s = NULL;
	if (use_acl)
		CHECK(acl_create_stream(&s) == 0, "aclrtCreateStream");
	else
		CHECK(cu_stream_create(&s, 1) == 0, "cuStreamCreate");
	return s;
}

// json_int reads the integer value of "key" in a flat JSON object.
static long long json_int(const char *json, const char *key) {
	char pat[256];
	snprintf(pat, sizeof pat, "\"%s\":", key);
	const char *p = strstr(json, pat);
	if (!p)
		return -1;
	return strtoll(p + strlen(pat), NULL, 10);
}

static long long stat(int dev, const char *key) {
	static char buf[1 << 16];
	size_t n = v_stats_json(dev, buf, sizeof buf);
	CHECK(n > 0 && n < sizeof buf, "stats_json(%d) returned %zu", dev, n);
	return json_int(buf, key);
}

// ---- signals the program installed before loading the library ----
static volatile sig_atomic_t usr1_count, segv_count;
static sigjmp_buf segv_jump;

static void on_usr1(int sig) {
	(void)sig;
	usr1_count++;
}

static void on_segv(int sig) {
	(void)sig;
	segv_count++;
	siglongjmp(segv_jump, 1);
}

static void install_handlers(void) {
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_usr1;
	sigemptyset(&sa.sa_mask);
	CHECK(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction SIGUSR1");
	sa.sa_handler = on_segv;
	sa.sa_flags = SA_NODEFER;
	CHECK(sigaction(SIGSEGV, &sa, NULL) == 0, "sigaction SIGSEGV");
}

static void check_handlers(void) {
	raise(SIGUSR1);
	CHECK(usr1_count == 1, "SIGUSR1 handler ran %d times", (int)usr1_count);
	struct sigaction cur;
	CHECK(sigaction(SIGUSR1, NULL, &cur) == 0 && cur.sa_handler == on_usr1, "SIGUSR1 handler replaced");
	// A fault in C code reaches the program's SIGSEGV handler (the Go
	// runtime's handler forwards faults outside Go code).
	char *page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(page != MAP_FAILED, "mmap");
	if (sigsetjmp(segv_jump, 1) == 0) {
		*(volatile char *)page = 1;
		CHECK(0, "no fault");
	}
	CHECK(segv_count == 1, "SIGSEGV handler ran %d times", (int)segv_count);
	munmap(page, 4096);
	printf("ok: signal handlers installed before loading still run (SIGUSR1, SIGSEGV forwarded)\n");
}

// ---- PyTorch's call pattern from several threads ----
#define THREADS 6
#define ROUNDS 400
#define WINDOW 24

static void *streams[THREADS];
static pthread_barrier_t ready;

struct live {
	unsigned char *p;
	size_t n;
	void *s;
	unsigned char tag;
};

static void *worker(void *arg) {
	int id = (int)(intptr_t)arg, dev = id % 2;
	set_device(dev);
	streams[id] = id == 0 ? NULL : new_stream(); // thread 0: the default stream
	pthread_barrier_wait(&ready);
	struct live live[WINDOW];
	int n = 0;
	uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(id + 1);
	for (int r = 0; r < ROUNDS; r++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		// PyTorch-like sizes: mostly small tensors, some large ones.
		size_t sz = (x % 8 == 0) ? 1 * MIB + (x >> 8) % (24 * MIB) : 1 + (x >> 8) % (256 * 1024);
		void *s = (r % 5 == 0) ? NULL : streams[id];
		unsigned char *p = v_alloc(sz, dev, s);
		CHECK(p != NULL, "thread %d alloc(%zu)", id, sz);
		unsigned char tag = (unsigned char)(id * 31 + r);
		p[0] = tag, p[sz - 1] = tag;
		live[n++] = (struct live){p, sz, s, tag};
		if (r % 7 == 0) {
			// Used on a side stream of the same device too.
			int other = (id + 2) % THREADS;
			CHECK(v_record_stream_checked(p, streams[other]) == 0, "record_stream");
		}
		if (n == WINDOW || (x >> 40) % 3 == 0) {
			int k = (int)((x >> 20) % (uint64_t)n);
			struct live b = live[k];
			CHECK(b.p[0] == b.tag && b.p[b.n - 1] == b.tag, "thread %d: block %p overwritten", id, (void *)b.p);
			v_free(b.p, b.n, dev, b.s);
			live[k] = live[--n];
		}
	}
	while (n > 0) {
		struct live b = live[--n];
		CHECK(b.p[0] == b.tag && b.p[b.n - 1] == b.tag, "thread %d: block overwritten", id);
		v_free(b.p, b.n, dev, b.s);
	}
	return NULL;
}

static void threads(void) {
	pthread_t th[THREADS];
	pthread_barrier_init(&ready, NULL, THREADS);
	for (int i = 0; i < THREADS; i++)
		CHECK(pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i) == 0, "pthread_create");
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	for (int d = 0; d < 2; d++) {
		CHECK(stat(d, "allocation.all.current") == 0, "device %d: allocations left", d);
		CHECK(stat(d, "allocated_bytes.all.current") == 0, "device %d: bytes left", d);
		CHECK(stat(d, "allocation.all.allocated") > 0, "device %d: nothing allocated", d);
	}
	printf("ok: %d threads x %d allocations on 2 devices, %d streams and the default stream, record_stream\n",
	       THREADS, ROUNDS, THREADS - 1);
}

static void stats_match(void) {
	size_t sizes[] = {1, 512, 513, 4096, 1000000, 3 * MIB + 7, 40 * MIB};
	void *ptrs[7];
	// Blocks freed with record_stream events pending still count as
	// requested until the events are processed; empty_cache waits for them.
	CHECK(v_empty_cache(0) == 0, "empty_cache");
	long long want = 0, before = stat(0, "requested_bytes.all.current");
	long long count = stat(0, "allocation.all.current");
	for (int i = 0; i < 7; i++) {
		ptrs[i] = v_alloc(sizes[i], 0, streams[2]);
		CHECK(ptrs[i], "alloc %zu", sizes[i]);
		want += (long long)sizes[i];
	}
	CHECK(stat(0, "requested_bytes.all.current") == before + want, "requested %lld, want %lld",
	      stat(0, "requested_bytes.all.current"), before + want);
	CHECK(stat(0, "allocation.all.current") == count + 7, "allocation count");
	CHECK(stat(0, "reserved_bytes.all.current") >= stat(0, "allocated_bytes.all.current"), "reserved < allocated");
	char small[8];
	size_t need = v_stats_json(-1, small, sizeof small);
	CHECK(need > sizeof small && small[sizeof small - 1] == 0 && small[0] == '{', "truncated stats");
	for (int i = 0; i < 7; i++)
		v_free(ptrs[i], sizes[i], 0, streams[2]);
	CHECK(stat(0, "requested_bytes.all.current") == before, "requested after free");
	printf("ok: JSON statistics match the allocations made (%lld bytes in 7 allocations)\n", want);
}

static void bad_arguments(void) {
	void *p = v_alloc(4096, 0, NULL);
	CHECK(p, "alloc");
	long long live = stat(0, "allocation.all.current");
	v_free((char *)p + 512, 4096, 0, NULL);
	CHECK(strstr(last_error(), "inside an allocation"), "interior free");
	v_free((void *)0x12345000, 4096, 0, NULL);
	CHECK(strstr(last_error(), "not allocated"), "unknown pointer");
	v_free(p, 4096, 1, NULL);
	CHECK(strstr(last_error(), "is of device 0"), "wrong device");
	CHECK(v_alloc(4096, 7, NULL) == NULL && strstr(last_error(), "invalid device"), "device 7");
	CHECK(v_alloc(4096, -1, NULL) == NULL && strstr(last_error(), "invalid device"), "device -1");
	if (!use_acl) { // ACL takes a stream's device on trust
		CHECK(v_alloc(4096, 0, (void *)0xdead000) == NULL && strstr(last_error(), "invalid stream"), "bogus stream");
		CHECK(v_alloc(4096, 0, streams[1]) == NULL && strstr(last_error(), "of device 1"), "stream of device 1");
	}
	CHECK(v_record_stream_checked((void *)0x12345000, NULL) == -1 && strstr(last_error(), "not allocated"), "record unknown");
	CHECK(v_set_memory_fraction(2.0, 0) == -1 && strstr(last_error(), "outside (0,1]"), "fraction 2");
	CHECK(v_end(0, 0, 42) == -1 && strstr(last_error(), "innermost"), "end without begin");
	CHECK(v_sleep(0, 0, 42, 0, 0) == -1 && strstr(last_error(), "invalid pool"), "sleep unknown pool");
	CHECK(v_sleep(0, 0, 0, 5, 0) == -1 && strstr(last_error(), "mode 5"), "sleep mode 5");
	CHECK(v_snapshot(NULL) == -1, "snapshot NULL");
	CHECK(stat(0, "allocation.all.current") == live, "bad calls changed the state");
	v_free(p, 4096, 0, NULL);
	v_free(NULL, 0, 0, NULL);
	CHECK(v_alloc(0, 0, NULL) == NULL, "alloc 0");
	printf("ok: bad pointers, devices, streams, fractions, pools refused with readable errors, nothing changed\n");
}

static void oom_and_fraction(void) {
	CHECK(v_empty_cache(-1) == 0, "empty_cache");
	CHECK(v_alloc(2048 * MIB, 0, NULL) == NULL && strstr(last_error(), "larger than device 0's"), "2 GiB on a 1 GiB device");
	void *big = v_alloc(700 * MIB, 0, NULL); // the double's devices have 1 GiB
	CHECK(big != NULL, "700 MiB");
	void *p = v_alloc(700 * MIB, 0, NULL);
	CHECK(p == NULL, "700 MiB more on a 1 GiB device");
	CHECK(strstr(last_error(), "out of memory"), "OOM message");
	CHECK(strstr(last_error(), "largest free block") && strstr(last_error(), "Advice: "), "OOM message whole, with its figures and advice");
	printf("ok: OOM returns NULL: %s\n", last_error());
	v_free(big, 700 * MIB, 0, NULL);
	CHECK(v_empty_cache(0) == 0, "empty_cache");

	v_memory_fraction(0.5, 0); // PyTorch's hook
	p = v_alloc(600 * MIB, 0, NULL);
	CHECK(p == NULL && strstr(last_error(), "allowed"), "600 MiB over a 0.5 fraction");
	CHECK(v_set_memory_fraction(1.0, 0) == 0, "fraction 1");
	p = v_alloc(600 * MIB, 0, NULL);
	CHECK(p != NULL, "600 MiB at fraction 1");
	v_free(p, 600 * MIB, 0, NULL);
	v_reset(); // PyTorch's reset hook: empty_cache
	CHECK(stat(0, "reserved_bytes.all.current") < (long long)(600 * MIB), "reset released");
	printf("ok: memory fraction caps growth and lifts; reset empties the cache\n");
}

static void pools_sleep_wake(void) {
	const uint64_t W0 = 0, W1 = 1, K0 = 0, K1 = 2; // weights (offloaded), KV cache (discarded)
	CHECK(v_begin(0, W0, W1) == 0, "begin weights");
	unsigned char *w = v_alloc(8 * MIB + 100, 0, NULL);
	CHECK(v_begin(0, K0, K1) == 0, "begin kv (nested)");
	unsigned char *kv = v_alloc(16 * MIB, 0, NULL);
	CHECK(v_end(0, K0, K1) == 0, "end kv");
	unsigned char *w2 = v_alloc(1000, 0, NULL); // weights again after the inner scope
	CHECK(v_end(0, W0, W1) == 0, "end weights");
	unsigned char *d = v_alloc(1000, 0, NULL); // default pool
	CHECK(w && kv && w2 && d, "pool allocations");
	for (size_t i = 0; i < 8 * MIB + 100; i++)
		w[i] = (unsigned char)(i * 7 + 3);
	memset(w2, 0x5A, 1000);
	memset(kv, 0x11, 16 * MIB);

	long long reserved = stat(0, "reserved_bytes.all.current");
	CHECK(v_sleep(0, W0, W1, VMMALLOC_OFFLOAD, 0) == 0, "sleep weights");
	CHECK(v_sleep(0, K0, K1, VMMALLOC_DISCARD, 0) == 0, "sleep kv");
	long long asleep = stat(0, "reserved_bytes.all.current");
	CHECK(asleep <= reserved - (long long)(24 * MIB), "sleep released %lld of %lld", reserved - asleep, reserved);
	CHECK(v_begin(0, W0, W1) == 0, "begin asleep pool");
	CHECK(v_alloc(512, 0, NULL) == NULL && strstr(last_error(), "asleep"), "alloc from a sleeping pool");
	CHECK(v_end(0, W0, W1) == 0, "end");
	CHECK(v_sleep(0, W0, W1, VMMALLOC_OFFLOAD, 0) == -1 && strstr(last_error(), "asleep"), "double sleep");
	CHECK(d[0] == d[0], "default pool still usable");
	CHECK(v_wake(0, W0, W1) == 0, "wake weights");
	CHECK(v_wake(0, K0, K1) == 0, "wake kv");
	CHECK(v_wake(0, K0, K1) == -1 && strstr(last_error(), "awake"), "double wake");
	for (size_t i = 0; i < 8 * MIB + 100; i++)
		CHECK(w[i] == (unsigned char)(i * 7 + 3), "weights byte %zu after wake", i);
	for (int i = 0; i < 1000; i++)
		CHECK(w2[i] == 0x5A, "weights byte %d after wake", i);
	memset(kv, 0x22, 16 * MIB); // discarded contents, but writable
	CHECK(v_sleep(0, K0, K1, VMMALLOC_MEMSET, 0) == 0, "sleep kv (memset)");
	CHECK(v_wake(0, K0, K1) == 0, "wake kv (memset)");
	for (size_t i = 0; i < 16 * MIB; i++)
		CHECK(kv[i] == 0, "kv byte %zu is zero after a memset wake", i);
	CHECK(v_sleep(0, K0, K1, 3, 0) == -1 && strstr(last_error(), "VMMALLOC_MEMSET"), "unknown sleep mode");
	CHECK(stat(0, "reserved_bytes.all.current") >= reserved - (long long)(2 * MIB), "wake mapped back");
	CHECK(v_release(0, W0, W1) == -1 && strstr(last_error(), "live allocations"), "release busy pool");
	v_free(w, 0, 0, NULL);
	v_free(w2, 0, 0, NULL);
	v_free(kv, 0, 0, NULL);
	v_free(d, 0, 0, NULL);
	CHECK(v_release(0, W0, W1) == 0 && v_release(0, K0, K1) == 0, "release pools");
	printf("ok: pool scopes (nested), sleep (offload, discard and memset) and wake with contents checked, release\n");
}

int main(int argc, char **argv) {
	if (argc != 3 || (strcmp(argv[1], "cuda") && strcmp(argv[1], "acl"))) {
		fprintf(stderr, "usage: %s cuda|acl SNAPSHOT_PATH\n", argv[0]);
		return 2;
	}
	use_acl = !strcmp(argv[1], "acl");
	install_handlers();
	load_runtime();
	set_device(0);
	load_library();
	v_init(2);
	CHECK(v_record_history(-1, 100000) == 0, "record_history");
	threads();
	stats_match();
	bad_arguments();
	oom_and_fraction();
	pools_sleep_wake();
	check_handlers();
	CHECK(v_snapshot(argv[2]) == 0, "snapshot");
	printf("ok: snapshot written to %s\n", argv[2]);
	printf("PASS\n");
	return 0;
}
