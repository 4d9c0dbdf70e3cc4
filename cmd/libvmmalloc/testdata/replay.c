// replay replays a trace through libvmmalloc.so's C entry points, as
// PyTorch would make the calls, over the CUDA test double, and measures
// the time per call. Run by the Go tests (replay_test.go):
//
//   replay EVENTS_FILE CAPACITY_BYTES LOOP_ITERATIONS
//
// EVENTS_FILE holds records of struct event (little-endian, as written by
// the test): allocation ids are dense (0..n-1), stream 0 is the default
// stream (NULL) and every other stream is created on device 0. It prints
// one JSON object of results on stdout.

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct event {
	uint8_t kind; // 1 alloc, 2 free, 3 record_stream, 5 empty_cache; others ignored
	uint8_t pad[3];
	uint32_t stream;
	uint64_t id;
	uint64_t size;
};

static void die(const char *what, const char *detail) {
	fprintf(stderr, "replay: %s: %s\n", what, detail ? detail : "");
	exit(1);
}

static void *sym(void *h, const char *name) {
	void *p = dlsym(h, name);
	if (!p)
		die(name, dlerror());
	return p;
}

static double now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static long long json_int(const char *json, const char *key) {
	char pat[256];
	snprintf(pat, sizeof pat, "\"%s\":", key);
	const char *p = strstr(json, pat);
	return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

int main(int argc, char **argv) {
	if (argc != 4)
		die("usage", "replay EVENTS_FILE CAPACITY_BYTES LOOP_ITERATIONS");
	unsigned long long capacity = strtoull(argv[2], NULL, 10);
	long loop = strtol(argv[3], NULL, 10);

	FILE *f = fopen(argv[1], "rb");
	if (!f)
		die("open", argv[1]);
	fseek(f, 0, SEEK_END);
	long bytes = ftell(f);
	fseek(f, 0, SEEK_SET);
	size_t n = (size_t)bytes / sizeof(struct event);
	struct event *ev = malloc(n * sizeof *ev);
	if (fread(ev, sizeof *ev, n, f) != n)
		die("read", argv[1]);
	fclose(f);
	uint64_t ids = 0;
	uint32_t nstreams = 1;
	for (size_t i = 0; i < n; i++) {
		if (ev[i].id + 1 > ids)
			ids = ev[i].id + 1;
		if (ev[i].stream + 1 > nstreams)
			nstreams = ev[i].stream + 1;
	}

	// The runtime: the double, its capacity, device 0 current, streams.
	void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!cu)
		die("dlopen libcuda.so.1", dlerror());
	int (*set_capacity)(int, uint64_t) = sym(cu, "fakecu_set_capacity");
	int (*cu_init)(unsigned) = sym(cu, "cuInit");
	int (*cu_retain)(void **, int) = sym(cu, "cuDevicePrimaryCtxRetain");
	int (*cu_set_current)(void *) = sym(cu, "cuCtxSetCurrent");
	int (*cu_stream_create)(void **, unsigned) = sym(cu, "cuStreamCreate");
	// After cuInit: the double sets its defaults at its first call.
	if (cu_init(0) != 0 || set_capacity(-1, capacity) != 0)
		die("double", "cuInit or capacity");
	void *ctx;
	if (cu_retain(&ctx, 0) != 0 || cu_set_current(ctx) != 0)
		die("double", "primary context");
	void **streams = calloc(nstreams, sizeof *streams);
	for (uint32_t s = 1; s < nstreams; s++)
		if (cu_stream_create(&streams[s], 1) != 0)
			die("double", "cuStreamCreate");

	void *h = dlopen("libvmmalloc.so", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		die("dlopen libvmmalloc.so", dlerror());
	void *(*v_alloc)(size_t, int, void *) = sym(h, "vmmalloc_alloc");
	void (*v_free)(void *, size_t, int, void *) = sym(h, "vmmalloc_free");
	int (*v_record)(void *, void *) = sym(h, "vmmalloc_record_stream_checked");
	int (*v_empty)(int) = sym(h, "vmmalloc_empty_cache");
	size_t (*v_stats)(int, char *, size_t) = sym(h, "vmmalloc_stats_json");
	size_t (*v_err)(char *, size_t) = sym(h, "vmmalloc_last_error");
	char err[4096];

	void **ptr = calloc(ids, sizeof *ptr);
	uint64_t *size = calloc(ids, sizeof *size);
	uint32_t *stream = calloc(ids, sizeof *stream);
	uint64_t live = 0, peak_live = 0, calls = 0, allocs = 0, frees = 0;
	double t0 = now_ns();
	for (size_t i = 0; i < n; i++) {
		struct event *e = &ev[i];
		switch (e->kind) {
		case 1:
			if (ptr[e->id] || e->size == 0)
				break;
			ptr[e->id] = v_alloc(e->size, 0, streams[e->stream]);
			calls++;
			if (!ptr[e->id]) {
				v_err(err, sizeof err);
				die("alloc", err);
			}
			size[e->id] = e->size, stream[e->id] = e->stream;
			live += e->size;
			if (live > peak_live)
				peak_live = live;
			allocs++;
			break;
		case 2:
			if (!ptr[e->id])
				break;
			v_free(ptr[e->id], size[e->id], 0, streams[stream[e->id]]);
			calls++;
			ptr[e->id] = NULL;
			live -= size[e->id];
			frees++;
			break;
		case 3:
			if (ptr[e->id] && v_record(ptr[e->id], streams[e->stream]) != 0) {
				v_err(err, sizeof err);
				die("record_stream", err);
			}
			calls++;
			break;
		case 5:
			v_empty(0);
			calls++;
			break;
		}
	}
	double replay_ns = now_ns() - t0;
	static char js[1 << 16];
	v_stats(0, js, sizeof js);
	long long peak_reserved = json_int(js, "reserved_bytes.all.peak");
	long long peak_allocated = json_int(js, "allocated_bytes.all.peak");
	for (uint64_t id = 0; id < ids; id++)
		if (ptr[id])
			v_free(ptr[id], size[id], 0, streams[stream[id]]);

	// The cache hit: one size on the default stream, alloc then free.
	void *p = v_alloc(4096, 0, NULL);
	v_free(p, 4096, 0, NULL);
	// The best of 5 rounds of loop/5 pairs, scaled to loop pairs: the
	// machine may be shared.
	double loop_ns = 0;
	for (int round = 0; round < 5; round++) {
		t0 = now_ns();
		for (long i = 0; i < loop / 5; i++) {
			p = v_alloc(4096, 0, NULL);
			v_free(p, 4096, 0, NULL);
		}
		double ns = (now_ns() - t0) * 5;
		if (round == 0 || ns < loop_ns)
			loop_ns = ns;
	}
	printf("{\"events\": %zu, \"calls\": %llu, \"allocs\": %llu, \"frees\": %llu, \"replay_ns\": %.0f, "
	       "\"peak_live\": %llu, \"peak_reserved\": %lld, \"peak_allocated\": %lld, \"loop\": %ld, \"loop_ns\": %.0f}\n",
	       n, (unsigned long long)calls, (unsigned long long)allocs, (unsigned long long)frees, replay_ns,
	       (unsigned long long)peak_live, peak_reserved, peak_allocated, loop, loop_ns);
	return 0;
}
