// The C entry points of vmmalloc.h. Each converts its arguments and calls
// one Go function (main.go, //export vmmgo_*), which recovers any panic.
// The pool a thread allocates to is thread-local state kept here, in C, so
// that vmmalloc_alloc reads it without a second call into Go.

#include <stdint.h>
#include <string.h>

#include "vmmalloc.h"
#include "_cgo_export.h"

#define MAX_POOL_DEPTH 16

// pool_scope is one begin_allocate_to_pool of this thread.
struct pool_scope {
	int device;
	uint64_t id0, id1;
};

static __thread struct pool_scope scopes[MAX_POOL_DEPTH];
static __thread int depth;

// current_pool finds the innermost scope of device; 0 when none.
static inline const struct pool_scope *current_pool(int device) {
	for (int i = depth - 1; i >= 0; i--)
		if (scopes[i].device == device)
			return &scopes[i];
	return NULL;
}

void *vmmalloc_alloc(size_t size, int device, vmmalloc_stream_t stream) {
	const struct pool_scope *p = depth ? current_pool(device) : NULL;
	return (void *)(uintptr_t)vmmgo_alloc(size, device, (uintptr_t)stream, p ? p->id0 : 0, p ? p->id1 : 0);
}

void vmmalloc_free(void *ptr, size_t size, int device, vmmalloc_stream_t stream) {
	(void)size;
	(void)stream;
	vmmgo_free((uintptr_t)ptr, device);
}

void vmmalloc_init(int device_count) { (void)vmmgo_init(device_count); }
void vmmalloc_reset(void) { (void)vmmgo_empty_cache(-1); }
void vmmalloc_npu_reset(bool check_error) {
	(void)check_error;
	(void)vmmgo_empty_cache(-1);
}
void vmmalloc_memory_fraction(double fraction, int device) { (void)vmmgo_set_memory_fraction(fraction, device); }
void vmmalloc_record_stream(void *ptr, vmmalloc_stream_t stream) {
	(void)vmmgo_record_stream((uintptr_t)ptr, (uintptr_t)stream);
}

int vmmalloc_empty_cache(int device) { return vmmgo_empty_cache(device); }
int vmmalloc_set_memory_fraction(double fraction, int device) { return vmmgo_set_memory_fraction(fraction, device); }
int vmmalloc_mark_step(int device) { return vmmgo_mark_step(device); }
int vmmalloc_record_stream_checked(void *ptr, vmmalloc_stream_t stream) {
	return vmmgo_record_stream((uintptr_t)ptr, (uintptr_t)stream);
}

int vmmalloc_begin_allocate_to_pool(int device, uint64_t id0, uint64_t id1) {
	if (depth == MAX_POOL_DEPTH) {
		vmmgo_set_error(device, id0, id1, 1);
		return -1;
	}
	if (vmmgo_begin_pool(device, id0, id1) != 0)
		return -1;
	scopes[depth++] = (struct pool_scope){device, id0, id1};
	return 0;
}

int vmmalloc_end_allocate_to_pool(int device, uint64_t id0, uint64_t id1) {
	// The innermost scope of device must be this pool.
	for (int i = depth - 1; i >= 0; i--) {
		if (scopes[i].device != device)
			continue;
		if (scopes[i].id0 != id0 || scopes[i].id1 != id1)
			break;
		memmove(&scopes[i], &scopes[i + 1], (size_t)(depth - i - 1) * sizeof scopes[0]);
		depth--;
		return 0;
	}
	vmmgo_set_error(device, id0, id1, 2);
	return -1;
}

int vmmalloc_release_pool(int device, uint64_t id0, uint64_t id1) { return vmmgo_release_pool(device, id0, id1); }

int vmmalloc_sleep(int device, uint64_t id0, uint64_t id1, int mode, int keep_host_buffers) {
	return vmmgo_sleep(device, id0, id1, mode, keep_host_buffers);
}

int vmmalloc_wake(int device, uint64_t id0, uint64_t id1) { return vmmgo_wake(device, id0, id1); }

size_t vmmalloc_stats_json(int device, char *buf, size_t len) { return vmmgo_stats_json(device, buf, len); }

int vmmalloc_record_history(int device, size_t max_entries) { return vmmgo_record_history(device, max_entries); }

int vmmalloc_snapshot(const char *path) { return vmmgo_snapshot((char *)path); }

size_t vmmalloc_last_error(char *buf, size_t len) { return vmmgo_last_error(buf, len); }
