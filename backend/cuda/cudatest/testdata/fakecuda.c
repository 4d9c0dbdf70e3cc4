/*
 * fakecuda.c: a test double for the CUDA driver library (libcuda.so.1).
 *
 * It exports the driver symbols the vmmalloc binding resolves, with the same
 * names (the _v2 ones included) and the same C ABI, over real host memory:
 *
 *   reservation   mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE)
 *   handle        memfd_create + ftruncate (a "fakecu-devN" memfd)
 *   map           mmap(va, PROT_NONE, MAP_SHARED|MAP_FIXED, fd): inaccessible
 *                 until cuMemSetAccess mprotects it
 *   unmap         mmap(va, PROT_NONE, anonymous, MAP_FIXED): back to reserved
 *   export        dup(fd); import fstat()s the fd to learn size and device
 *   copy, memset  memcpy/memset after checking the device ranges are mapped
 *                 and accessible; each is a work item of its stream, which
 *                 tests may hold pending to order events (fakecu_hold)
 *
 * and enforces the real driver's rules: granularity and alignment, ranges
 * inside one reservation, no overlapping maps, unmap of exactly one mapping,
 * address free only of a whole reservation with nothing mapped, release
 * deferred while mapped, retain references, per-device capacity, strict prop
 * checks, and per-thread current contexts.
 *
 * A handle's memfd is a number in the process's fd table, which the process
 * shares with the code under test: code that closes an fd it does not own
 * (a stray os.File finalizer, a double close) can close a handle's memfd,
 * and the next memfd_create reuses the number, so the handle would silently
 * map another handle's memory. Each handle records its memfd's st_dev and
 * st_ino at create (or import) and checks them at every map, export and
 * release: a changed or closed backing fails the call with
 * CUDA_ERROR_ILLEGAL_STATE (401), prints why on stderr, and is counted for
 * fakecu_backing_errors; the double never closes an fd that is no longer its
 * own.
 *
 * All declarations are written from the public driver API documentation; no
 * vendor header is used. Control entry points are prefixed fakecu_. One
 * global mutex serialises every call (nothing here blocks).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef uint64_t CUmemGenericAllocationHandle;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;

typedef struct { int type; int id; } CUmemLocation;
typedef struct {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;

_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp");
_Static_assert(offsetof(CUmemAllocationProp, location) == 8, "prop.location");
_Static_assert(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16, "prop.win32");
_Static_assert(offsetof(CUmemAllocationProp, allocFlags) == 24, "prop.allocFlags");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc");
_Static_assert(offsetof(CUmemAccessDesc, flags) == 8, "desc.flags");

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_ILLEGAL_STATE = 401,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
	CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
	CUDA_ERROR_NOT_SUPPORTED = 801,
};

#define MAXDEV 8
#define MAXFAULTS 16

/* Symbols, for call counts, fault injection and the context rule. */
#define SYMBOLS(X)                                        \
	X(cuInit, 0)                                          \
	X(cuDeviceGetCount, 0)                                \
	X(cuDeviceGet, 0)                                     \
	X(cuDeviceGetAttribute, 0)                            \
	X(cuDevicePrimaryCtxRetain, 0)                        \
	X(cuDevicePrimaryCtxRelease_v2, 0)                    \
	X(cuCtxSetCurrent, 0)                                 \
	X(cuCtxSynchronize, 1)                                \
	X(cuMemGetInfo_v2, 1)                                 \
	X(cuMemGetAllocationGranularity, 1)                   \
	X(cuMemAddressReserve, 1)                             \
	X(cuMemAddressFree, 1)                                \
	X(cuMemCreate, 1)                                     \
	X(cuMemRelease, 1)                                    \
	X(cuMemMap, 1)                                        \
	X(cuMemUnmap, 1)                                      \
	X(cuMemSetAccess, 1)                                  \
	X(cuMemGetAccess, 1)                                  \
	X(cuMemGetAddressRange_v2, 1)                         \
	X(cuMemRetainAllocationHandle, 1)                     \
	X(cuMemGetAllocationPropertiesFromHandle, 1)          \
	X(cuMemExportToShareableHandle, 1)                    \
	X(cuMemImportFromShareableHandle, 1)                  \
	X(cuStreamCreate, 1)                                  \
	X(cuStreamDestroy_v2, 1)                              \
	X(cuStreamSynchronize, 1)                             \
	X(cuStreamGetCtx, 0)                                  \
	X(cuEventCreate, 1)                                   \
	X(cuEventRecord, 1)                                   \
	X(cuEventQuery, 1)                                    \
	X(cuEventSynchronize, 1)                              \
	X(cuEventDestroy_v2, 1)                               \
	X(cuMemHostAlloc, 1)                                  \
	X(cuMemFreeHost, 1)                                   \
	X(cuMemHostRegister_v2, 1)                            \
	X(cuMemHostUnregister, 1)                             \
	X(cuMemHostGetDevicePointer_v2, 1)                    \
	X(cuMemcpyHtoDAsync_v2, 1)                            \
	X(cuMemcpyDtoHAsync_v2, 1)                            \
	X(cuMemcpyDtoDAsync_v2, 1)                            \
	X(cuMemsetD8Async, 1)

#define ENUM(name, ctx) SYM_##name,
enum { SYMBOLS(ENUM) NSYM };
#define NAME(name, ctx) #name,
static const char *symNames[NSYM] = {SYMBOLS(NAME)};
#define NEEDCTX(name, ctx) ctx,
static const int symNeedsCtx[NSYM] = {SYMBOLS(NEEDCTX)};

struct ctx {
	int dev;
	int refs; /* primary context retains */
};

struct handle {
	struct handle *next;
	int fd;
	dev_t fdDev;  /* st_dev and st_ino of fd at create/import: the backing */
	ino_t fdIno;
	size_t size;
	int refs;     /* creation/import + retains; 0: released, kept while mapped */
	int maps;     /* live mappings */
	int dev;
	int imported; /* not charged to the device */
	CUmemAllocationProp prop;
};

struct reservation {
	struct reservation *next;
	uintptr_t va;
	size_t size;
	uintptr_t raw;    /* what mmap returned (alignment slack trimmed) */
};

struct mapping {
	struct mapping *next;
	uintptr_t va;
	size_t size;
	struct handle *h;
	int access[MAXDEV]; /* CUmemAccess_flags per device */
};

struct stream {
	struct stream *next;
	int dev;
	int held;        /* work stays pending until fakecu_complete or a sync */
	uint64_t queued; /* work items queued (copies, memsets, fakecu_launch) */
	uint64_t done;   /* work items completed, in order */
};

struct event {
	struct event *next;
	int dev;
	struct stream *s; /* stream of the last record; NULL: complete */
	uint64_t target;  /* s->queued at the record */
};

struct hostblock {
	struct hostblock *next;
	uintptr_t p;
	size_t size;
	int registered; /* 1: cuMemHostRegister range, 0: cuMemHostAlloc block */
	unsigned flags;
};

struct fault {
	int sym, nth, code; /* the nth next call of sym fails with code */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static __thread struct ctx *current; /* the calling thread's current context */

static int initialized;
static int ndev = 2;
static size_t capacity[MAXDEV];
static size_t used[MAXDEV];
static size_t granMin = 2 << 20, granRec = 2 << 20;
static int strictCtx;
static struct ctx ctxs[MAXDEV];
static struct handle *handles;
static struct reservation *reservations;
static struct mapping *mappings;
static struct stream *streams;
static struct event *events;
static struct hostblock *hostblocks;
static struct fault faults[MAXFAULTS];
static int nfaults;
static long long calls[NSYM];
static int guardPattern = 1;
static long long backingErrors;  /* handles found with a changed backing */
static char backingWhy[256];     /* the first such finding since reset */

static void setDefaults(void) {
	for (int i = 0; i < MAXDEV; i++) {
		capacity[i] = (size_t)1 << 30;
		ctxs[i].dev = i;
	}
}

/* The defaults are in place when the library is loaded, before any control
 * or driver call: a capacity set before the first driver call stays. */
__attribute__((constructor)) static void initDefaults(void) { setDefaults(); }

/* enter counts the call, applies injected faults and the context rule. It
 * returns 0 to go on, or the code to fail with. Called with mu held. */
static int enter(int sym) {
	calls[sym]++;
	for (int i = 0; i < nfaults; i++) {
		if (faults[i].sym == sym && --faults[i].nth == 0) {
			int code = faults[i].code;
			faults[i] = faults[--nfaults];
			return code;
		}
	}
	if (sym != SYM_cuInit && !initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (symNeedsCtx[sym] && (strictCtx || sym == SYM_cuMemGetInfo_v2 || sym == SYM_cuCtxSynchronize ||
	                         sym == SYM_cuStreamCreate || sym == SYM_cuEventCreate) &&
	    current == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	return 0;
}

#define ENTER(name)                     \
	pthread_mutex_lock(&mu);            \
	int rc_ = enter(SYM_##name);        \
	if (rc_ != 0) {                     \
		pthread_mutex_unlock(&mu);      \
		return rc_;                     \
	}
#define RETURN(code)                    \
	do {                                \
		int c_ = (code);                \
		pthread_mutex_unlock(&mu);      \
		return c_;                      \
	} while (0)

/* ---- lookups (mu held) ---- */

static struct handle *findHandle(CUmemGenericAllocationHandle h) {
	for (struct handle *x = handles; x; x = x->next)
		if ((uint64_t)(uintptr_t)x == h && x->refs > 0)
			return x;
	return NULL;
}

static struct reservation *findReservation(uintptr_t va, size_t size) {
	for (struct reservation *r = reservations; r; r = r->next)
		if (va >= r->va && size <= r->size && va - r->va <= r->size - size)
			return r;
	return NULL;
}

static struct mapping *mappingAt(uintptr_t va) {
	for (struct mapping *m = mappings; m; m = m->next)
		if (va >= m->va && va - m->va < m->size)
			return m;
	return NULL;
}

static int overlapsMapping(uintptr_t va, size_t size) {
	for (struct mapping *m = mappings; m; m = m->next)
		if (va < m->va + m->size && m->va < va + size)
			return 1;
	return 0;
}

/* backingOK reports whether h's fd still names the memfd it was created
 * (or imported) with. If not, someone closed the double's fd and the number
 * may now name other memory: it says so on stderr and counts it. */
static int backingOK(struct handle *h, const char *call) {
	struct stat st;
	if (fstat(h->fd, &st) == 0 && st.st_dev == h->fdDev && st.st_ino == h->fdIno)
		return 1;
	char why[sizeof backingWhy];
	if (fcntl(h->fd, F_GETFD) < 0)
		snprintf(why, sizeof why, "%s: handle %#llx: its memfd (fd %d) was closed behind the double's back",
		         call, (unsigned long long)(uintptr_t)h, h->fd);
	else
		snprintf(why, sizeof why, "%s: handle %#llx: its fd %d now names another file (inode %llu, was %llu): "
		         "its memfd was closed behind the double's back and the number reused",
		         call, (unsigned long long)(uintptr_t)h, h->fd, (unsigned long long)st.st_ino,
		         (unsigned long long)h->fdIno);
	fprintf(stderr, "fakecuda: BACKING CHANGED: %s (a caller closed a file descriptor it does not own)\n", why);
	if (backingErrors++ == 0)
		memcpy(backingWhy, why, sizeof why);
	return 0;
}

/* recordBacking remembers what fd names, for backingOK. */
static int recordBacking(struct handle *h) {
	struct stat st;
	if (fstat(h->fd, &st) != 0)
		return 0;
	h->fdDev = st.st_dev;
	h->fdIno = st.st_ino;
	return 1;
}

static void dropHandle(struct handle *h) {
	if (h->refs > 0 || h->maps > 0)
		return;
	struct handle **pp = &handles;
	while (*pp != h)
		pp = &(*pp)->next;
	*pp = h->next;
	if (!h->imported)
		used[h->dev] -= h->size;
	if (backingOK(h, "release")) /* never close an fd that is not ours any more */
		close(h->fd);
	free(h);
}

/* rangeOK reports whether [va, va+n) is covered by adjacent mappings that all
 * grant at least want (1 read, 3 read-write) to dev. */
static int rangeOK(uintptr_t va, size_t n, int dev, int want) {
	while (n > 0) {
		struct mapping *m = mappingAt(va);
		if (m == NULL || (m->access[dev] & want) != want)
			return 0;
		size_t in = m->va + m->size - va;
		if (in >= n)
			return 1;
		va += in;
		n -= in;
	}
	return 1;
}

static int validProp(const CUmemAllocationProp *p) {
	static const unsigned char zero[8];
	return p != NULL && p->type == 1 && p->location.type == 1 && p->location.id >= 0 &&
	       p->location.id < ndev && p->win32HandleMetaData == NULL &&
	       (p->requestedHandleTypes == 0 || p->requestedHandleTypes == 1) &&
	       memcmp(&p->allocFlags, zero, sizeof zero) == 0;
}

/* ---- init, devices, contexts ---- */

CUresult cuInit(unsigned int flags) {
	ENTER(cuInit);
	if (flags != 0)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	initialized = 1;
	RETURN(CUDA_SUCCESS);
}

CUresult cuDeviceGetCount(int *count) {
	ENTER(cuDeviceGetCount);
	if (!count)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	*count = ndev;
	RETURN(CUDA_SUCCESS);
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
	ENTER(cuDeviceGet);
	if (!dev)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	if (ordinal < 0 || ordinal >= ndev)
		RETURN(CUDA_ERROR_INVALID_DEVICE);
	*dev = ordinal;
	RETURN(CUDA_SUCCESS);
}

CUresult cuDeviceGetAttribute(int *pi, int attr, CUdevice dev) {
	ENTER(cuDeviceGetAttribute);
	if (!pi)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	if (dev < 0 || dev >= ndev)
		RETURN(CUDA_ERROR_INVALID_DEVICE);
	switch (attr) {
	case 102: /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
	case 103: /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
		*pi = 1;
		RETURN(CUDA_SUCCESS);
	}
	RETURN(CUDA_ERROR_INVALID_VALUE);
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
	ENTER(cuDevicePrimaryCtxRetain);
	if (!pctx)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	if (dev < 0 || dev >= ndev)
		RETURN(CUDA_ERROR_INVALID_DEVICE);
	ctxs[dev].refs++;
	*pctx = &ctxs[dev];
	RETURN(CUDA_SUCCESS);
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
	ENTER(cuDevicePrimaryCtxRelease_v2);
	if (dev < 0 || dev >= ndev)
		RETURN(CUDA_ERROR_INVALID_DEVICE);
	if (ctxs[dev].refs == 0)
		RETURN(CUDA_ERROR_INVALID_CONTEXT);
	ctxs[dev].refs--;
	RETURN(CUDA_SUCCESS);
}

CUresult cuCtxSetCurrent(CUcontext c) {
	ENTER(cuCtxSetCurrent);
	if (c == NULL) {
		current = NULL;
		RETURN(CUDA_SUCCESS);
	}
	struct ctx *x = c;
	if (x < &ctxs[0] || x >= &ctxs[ndev] || x->refs == 0)
		RETURN(CUDA_ERROR_INVALID_CONTEXT);
	current = x;
	RETURN(CUDA_SUCCESS);
}

CUresult cuCtxSynchronize(void) {
	ENTER(cuCtxSynchronize);
	for (struct stream *x = streams; x; x = x->next)
		if (x->dev == current->dev)
			x->done = x->queued;
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemGetInfo_v2(size_t *freeb, size_t *total) {
	ENTER(cuMemGetInfo_v2);
	if (!freeb || !total)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	*total = capacity[current->dev];
	*freeb = capacity[current->dev] - used[current->dev];
	RETURN(CUDA_SUCCESS);
}

/* ---- virtual memory management ---- */

CUresult cuMemGetAllocationGranularity(size_t *gran, const CUmemAllocationProp *prop, int opt) {
	ENTER(cuMemGetAllocationGranularity);
	if (!gran || !validProp(prop) || (opt != 0 && opt != 1))
		RETURN(CUDA_ERROR_INVALID_VALUE);
	*gran = opt == 0 ? granMin : granRec;
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                             unsigned long long flags) {
	ENTER(cuMemAddressReserve);
	(void)addr; /* a hint only */
	if (!ptr || size == 0 || size % granMin != 0 || flags != 0 || (align & (align - 1)) != 0)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	if (align < granMin)
		align = granMin;
	size_t span = size + align;
	void *raw = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (raw == MAP_FAILED)
		RETURN(CUDA_ERROR_OUT_OF_MEMORY);
	uintptr_t va = ((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1);
	/* Trim the slack so the reservation is exactly [va, va+size). */
	if (va > (uintptr_t)raw)
		munmap(raw, va - (uintptr_t)raw);
	uintptr_t end = (uintptr_t)raw + span;
	if (end > va + size)
		munmap((void *)(va + size), end - (va + size));
	struct reservation *r = calloc(1, sizeof *r);
	r->va = va;
	r->size = size;
	r->raw = va;
	r->next = reservations;
	reservations = r;
	*ptr = va;
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
	ENTER(cuMemAddressFree);
	struct reservation **pp = &reservations;
	while (*pp && !((*pp)->va == ptr && (*pp)->size == size))
		pp = &(*pp)->next;
	if (*pp == NULL || overlapsMapping(ptr, size))
		RETURN(CUDA_ERROR_INVALID_VALUE);
	struct reservation *r = *pp;
	*pp = r->next;
	munmap((void *)r->va, r->size);
	free(r);
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
	ENTER(cuMemCreate);
	if (!h || !validProp(prop) || size == 0 || size % granMin != 0 || flags != 0)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	int dev = prop->location.id;
	if (size > capacity[dev] - used[dev])
		RETURN(CUDA_ERROR_OUT_OF_MEMORY);
	char name[32];
	snprintf(name, sizeof name, "fakecu-dev%d", dev);
	int fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0)
		RETURN(CUDA_ERROR_OUT_OF_MEMORY);
	if (ftruncate(fd, (off_t)size) != 0) {
		close(fd);
		RETURN(CUDA_ERROR_OUT_OF_MEMORY);
	}
	if (guardPattern) {
		/* Device memory is not zeroed: make code that assumes it is fail. */
		unsigned char g[4096];
		memset(g, 0xA5, sizeof g);
		size_t n = size < sizeof g ? size : sizeof g;
		if (pwrite(fd, g, n, 0) != (ssize_t)n || pwrite(fd, g, n, (off_t)(size - n)) != (ssize_t)n) {
			close(fd);
			RETURN(CUDA_ERROR_OUT_OF_MEMORY);
		}
	}
	struct handle *x = calloc(1, sizeof *x);
	x->fd = fd;
	if (!recordBacking(x)) {
		close(fd);
		free(x);
		RETURN(CUDA_ERROR_OUT_OF_MEMORY);
	}
	x->size = size;
	x->refs = 1;
	x->dev = dev;
	x->prop = *prop;
	x->next = handles;
	handles = x;
	used[dev] += size;
	*h = (uint64_t)(uintptr_t)x;
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
	ENTER(cuMemRelease);
	struct handle *x = findHandle(h);
	if (!x)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	if (!backingOK(x, "cuMemRelease"))
		RETURN(CUDA_ERROR_ILLEGAL_STATE);
	x->refs--;
	dropHandle(x); /* deferred while mapped */
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                  unsigned long long flags) {
	ENTER(cuMemMap);
	struct handle *x = findHandle(h);
	if (!x)
		RETURN(CUDA_ERROR_INVALID_HANDLE);
	if (size == 0 || size % granMin != 0 || ptr % granMin != 0 || offset % granMin != 0 || flags != 0 ||
	    offset > x->size || size > x->size - offset || !findReservation(ptr, size) ||
	    overlapsMapping(ptr, size))
		RETURN(CUDA_ERROR_INVALID_VALUE);
	if (!backingOK(x, "cuMemMap"))
		RETURN(CUDA_ERROR_ILLEGAL_STATE);
	void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, x->fd, (off_t)offset);
	if (p == MAP_FAILED)
		RETURN(CUDA_ERROR_OUT_OF_MEMORY);
	struct mapping *m = calloc(1, sizeof *m);
	m->va = ptr;
	m->size = size;
	m->h = x;
	m->next = mappings;
	mappings = m;
	x->maps++;
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
	ENTER(cuMemUnmap);
	struct mapping **pp = &mappings;
	while (*pp && !((*pp)->va == ptr && (*pp)->size == size))
		pp = &(*pp)->next;
	if (*pp == NULL)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	struct mapping *m = *pp;
	void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
	               -1, 0);
	if (p == MAP_FAILED)
		RETURN(CUDA_ERROR_OUT_OF_MEMORY);
	*pp = m->next;
	m->h->maps--;
	dropHandle(m->h);
	free(m);
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
	ENTER(cuMemSetAccess);
	if (!desc || count == 0 || count > MAXDEV || size == 0)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	for (size_t i = 0; i < count; i++) {
		const CUmemAccessDesc *d = &desc[i];
		if (d->location.type != 1 || d->location.id < 0 || d->location.id >= ndev ||
		    (d->flags != 0 && d->flags != 1 && d->flags != 3))
			RETURN(CUDA_ERROR_INVALID_VALUE);
	}
	/* The range must be covered by whole mappings. */
	uintptr_t va = ptr;
	size_t n = size;
	while (n > 0) {
		struct mapping *m = mappingAt(va);
		if (!m || m->va != va || m->size > n)
			RETURN(CUDA_ERROR_INVALID_VALUE);
		va += m->size;
		n -= m->size;
	}
	for (va = ptr; va < ptr + size;) {
		struct mapping *m = mappingAt(va);
		int prot = PROT_NONE;
		for (size_t i = 0; i < count; i++)
			m->access[desc[i].location.id] = desc[i].flags;
		for (int d = 0; d < ndev; d++) {
			if (m->access[d] == 3)
				prot = PROT_READ | PROT_WRITE;
			else if (m->access[d] == 1 && prot == PROT_NONE)
				prot = PROT_READ;
		}
		if (mprotect((void *)m->va, m->size, prot) != 0)
			RETURN(CUDA_ERROR_INVALID_VALUE);
		va += m->size;
	}
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *loc, CUdeviceptr ptr) {
	ENTER(cuMemGetAccess);
	if (!flags || !loc || loc->type != 1 || loc->id < 0 || loc->id >= ndev)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	struct mapping *m = mappingAt(ptr);
	if (!m)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	*flags = (unsigned long long)m->access[loc->id];
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
	ENTER(cuMemGetAddressRange_v2);
	struct mapping *m = mappingAt(ptr);
	if (!m)
		RETURN(CUDA_ERROR_NOT_FOUND);
	if (base)
		*base = m->va;
	if (size)
		*size = m->size;
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
	ENTER(cuMemRetainAllocationHandle);
	struct mapping *m = mappingAt((uintptr_t)addr);
	if (!h || !m)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	m->h->refs++;
	*h = (uint64_t)(uintptr_t)m->h;
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
	ENTER(cuMemGetAllocationPropertiesFromHandle);
	struct handle *x = findHandle(h);
	if (!prop || !x)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	*prop = x->prop;
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type, unsigned long long flags) {
	ENTER(cuMemExportToShareableHandle);
	struct handle *x = findHandle(h);
	if (!out || !x || flags != 0)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	if (type != 1 || !(x->prop.requestedHandleTypes & 1))
		RETURN(CUDA_ERROR_NOT_SUPPORTED);
	if (!backingOK(x, "cuMemExportToShareableHandle"))
		RETURN(CUDA_ERROR_ILLEGAL_STATE);
	int fd = fcntl(x->fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		RETURN(CUDA_ERROR_OUT_OF_MEMORY);
	*(int *)out = fd;
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *osHandle, int type) {
	ENTER(cuMemImportFromShareableHandle);
	if (!h || type != 1)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	int fd = (int)(intptr_t)osHandle;
	struct stat st;
	char link[64], target[128];
	snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, target, sizeof target - 1);
	int dev = -1;
	if (n > 0) {
		target[n] = 0;
		if (sscanf(target, "/memfd:fakecu-dev%d", &dev) != 1)
			dev = -1;
	}
	if (fstat(fd, &st) != 0 || dev < 0 || dev >= ndev || st.st_size <= 0 || (size_t)st.st_size % granMin != 0)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (own < 0)
		RETURN(CUDA_ERROR_OUT_OF_MEMORY);
	struct handle *x = calloc(1, sizeof *x);
	x->fd = own;
	if (!recordBacking(x)) {
		close(own);
		free(x);
		RETURN(CUDA_ERROR_INVALID_VALUE);
	}
	x->size = (size_t)st.st_size;
	x->refs = 1;
	x->dev = dev;
	x->imported = 1;
	x->prop.type = 1;
	x->prop.requestedHandleTypes = 1;
	x->prop.location.type = 1;
	x->prop.location.id = dev;
	x->next = handles;
	handles = x;
	*h = (uint64_t)(uintptr_t)x;
	RETURN(CUDA_SUCCESS);
}

/* ---- streams and events ----
 * Each stream counts work queued (copies, memsets, fakecu_launch) and work
 * done. Work completes at once unless the stream is held (fakecu_hold);
 * then it completes through fakecu_complete or a synchronize. An event
 * captures its stream's queued count at the record and is complete once
 * the stream's done count reaches it. */

static struct stream *findStream(CUstream s) {
	for (struct stream *x = streams; x; x = x->next)
		if ((void *)x == s)
			return x;
	return NULL;
}

/* isDefaultStream: NULL, CU_STREAM_LEGACY (0x1) and CU_STREAM_PER_THREAD
 * (0x2) name the current context's default stream, which the double runs
 * at once (no work on it is ever pending). */
static int isDefaultStream(CUstream s) {
	return s == NULL || (uintptr_t)s == 1 || (uintptr_t)s == 2;
}

static struct event *findEvent(CUevent e) {
	for (struct event *x = events; x; x = x->next)
		if ((void *)x == e)
			return x;
	return NULL;
}

/* queueWork queues one work item on s (NULL: the legacy stream, which
 * completes at once). */
static void queueWork(CUstream s) {
	struct stream *x = findStream(s);
	if (!x)
		return;
	x->queued++;
	if (!x->held)
		x->done = x->queued;
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
	ENTER(cuStreamCreate);
	if (!s || flags > 1)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	struct stream *x = calloc(1, sizeof *x);
	x->dev = current->dev;
	x->next = streams;
	streams = x;
	*s = x;
	RETURN(CUDA_SUCCESS);
}

CUresult cuStreamDestroy_v2(CUstream s) {
	ENTER(cuStreamDestroy_v2);
	struct stream **pp = &streams;
	while (*pp && (void *)*pp != s)
		pp = &(*pp)->next;
	if (!*pp)
		RETURN(CUDA_ERROR_INVALID_HANDLE);
	struct stream *x = *pp;
	*pp = x->next;
	/* Destroying a stream lets its work finish: its events complete. */
	for (struct event *e = events; e; e = e->next)
		if (e->s == x)
			e->s = NULL;
	free(x);
	RETURN(CUDA_SUCCESS);
}

CUresult cuStreamSynchronize(CUstream s) {
	ENTER(cuStreamSynchronize);
	struct stream *x = findStream(s);
	if (!isDefaultStream(s) && !x)
		RETURN(CUDA_ERROR_INVALID_HANDLE);
	if (x)
		x->done = x->queued;
	RETURN(CUDA_SUCCESS);
}

/* cuStreamGetCtx: the context of a created stream; a default-stream handle
 * names the current context. */
CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx) {
	ENTER(cuStreamGetCtx);
	if (!pctx)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	if (isDefaultStream(s)) {
		if (!current)
			RETURN(CUDA_ERROR_INVALID_CONTEXT);
		*pctx = current;
		RETURN(CUDA_SUCCESS);
	}
	struct stream *x = findStream(s);
	if (!x)
		RETURN(CUDA_ERROR_INVALID_HANDLE);
	*pctx = &ctxs[x->dev];
	RETURN(CUDA_SUCCESS);
}

CUresult cuEventCreate(CUevent *e, unsigned int flags) {
	ENTER(cuEventCreate);
	if (!e || flags > 0xF)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	struct event *x = calloc(1, sizeof *x);
	x->dev = current->dev;
	x->next = events;
	events = x;
	*e = x;
	RETURN(CUDA_SUCCESS);
}

CUresult cuEventRecord(CUevent e, CUstream s) {
	ENTER(cuEventRecord);
	struct event *x = findEvent(e);
	struct stream *st = findStream(s);
	if (!x || (!isDefaultStream(s) && !st))
		RETURN(CUDA_ERROR_INVALID_HANDLE);
	if (st && st->dev != x->dev)
		RETURN(CUDA_ERROR_INVALID_HANDLE); /* event and stream of different contexts */
	x->s = st;
	x->target = st ? st->queued : 0;
	RETURN(CUDA_SUCCESS);
}

CUresult cuEventQuery(CUevent e) {
	ENTER(cuEventQuery);
	struct event *x = findEvent(e);
	if (!x)
		RETURN(CUDA_ERROR_INVALID_HANDLE);
	RETURN(x->s && x->s->done < x->target ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

CUresult cuEventSynchronize(CUevent e) {
	ENTER(cuEventSynchronize);
	struct event *x = findEvent(e);
	if (!x)
		RETURN(CUDA_ERROR_INVALID_HANDLE);
	if (x->s && x->s->done < x->target)
		x->s->done = x->target; /* waiting completes the captured work */
	RETURN(CUDA_SUCCESS);
}

CUresult cuEventDestroy_v2(CUevent e) {
	ENTER(cuEventDestroy_v2);
	struct event **pp = &events;
	while (*pp && (void *)*pp != e)
		pp = &(*pp)->next;
	if (!*pp)
		RETURN(CUDA_ERROR_INVALID_HANDLE);
	struct event *x = *pp;
	*pp = x->next;
	free(x);
	RETURN(CUDA_SUCCESS);
}

/* ---- host memory: device pointer == host pointer (unified addressing) ---- */

static struct hostblock *hostAt(uintptr_t p, int registered) {
	for (struct hostblock *b = hostblocks; b; b = b->next)
		if (b->registered == registered && p >= b->p && p - b->p < b->size)
			return b;
	return NULL;
}

CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
	ENTER(cuMemHostAlloc);
	if (!pp || size == 0 || flags > 7)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	void *p = NULL;
	if (posix_memalign(&p, 4096, size) != 0)
		RETURN(CUDA_ERROR_OUT_OF_MEMORY);
	struct hostblock *b = calloc(1, sizeof *b);
	b->p = (uintptr_t)p;
	b->size = size;
	b->flags = flags;
	b->next = hostblocks;
	hostblocks = b;
	*pp = p;
	RETURN(CUDA_SUCCESS);
}

static void unlinkHost(struct hostblock *b) {
	struct hostblock **pp = &hostblocks;
	while (*pp != b)
		pp = &(*pp)->next;
	*pp = b->next;
}

CUresult cuMemFreeHost(void *p) {
	ENTER(cuMemFreeHost);
	struct hostblock *b = hostAt((uintptr_t)p, 0);
	if (!b || b->p != (uintptr_t)p)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	unlinkHost(b);
	free((void *)b->p);
	free(b);
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags) {
	ENTER(cuMemHostRegister_v2);
	if (!p || size == 0 || flags > 0xF)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	if (flags & 0x4) /* IOMEMORY: no PCIe I/O space here */
		RETURN(CUDA_ERROR_NOT_SUPPORTED);
	for (struct hostblock *b = hostblocks; b; b = b->next)
		if (b->registered && (uintptr_t)p < b->p + b->size && b->p < (uintptr_t)p + size)
			RETURN(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
	/* Memory from cuMemHostAlloc is pinned already, and CUDA refuses to
	 * register it: CUDA_ERROR_INVALID_VALUE (measured on an H200; ACL's
	 * aclrtHostRegister accepts aclrtMallocHost memory). */
	for (struct hostblock *b = hostblocks; b; b = b->next)
		if (!b->registered && (uintptr_t)p < b->p + b->size && b->p < (uintptr_t)p + size)
			RETURN(CUDA_ERROR_INVALID_VALUE);
	struct hostblock *b = calloc(1, sizeof *b);
	b->p = (uintptr_t)p;
	b->size = size;
	b->registered = 1;
	b->flags = flags;
	b->next = hostblocks;
	hostblocks = b;
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemHostUnregister(void *p) {
	ENTER(cuMemHostUnregister);
	struct hostblock *b = hostAt((uintptr_t)p, 1);
	if (!b || b->p != (uintptr_t)p)
		RETURN(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
	unlinkHost(b);
	free(b);
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned int flags) {
	ENTER(cuMemHostGetDevicePointer_v2);
	if (!d || flags != 0)
		RETURN(CUDA_ERROR_INVALID_VALUE);
	if (!hostAt((uintptr_t)p, 1) && !hostAt((uintptr_t)p, 0))
		RETURN(CUDA_ERROR_INVALID_VALUE);
	*d = (uintptr_t)p;
	RETURN(CUDA_SUCCESS);
}

/* ---- data: the stream's device must have access to every byte ---- */

static int streamDev(CUstream s) {
	if (isDefaultStream(s))
		return current ? current->dev : -1;
	struct stream *x = findStream(s);
	return x ? x->dev : -1;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
	ENTER(cuMemcpyHtoDAsync_v2);
	int dev = streamDev(s);
	if (dev < 0)
		RETURN(CUDA_ERROR_INVALID_HANDLE);
	if (!src || !rangeOK(dst, n, dev, 3))
		RETURN(CUDA_ERROR_INVALID_VALUE);
	memcpy((void *)(uintptr_t)dst, src, n);
	queueWork(s);
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
	ENTER(cuMemcpyDtoHAsync_v2);
	int dev = streamDev(s);
	if (dev < 0)
		RETURN(CUDA_ERROR_INVALID_HANDLE);
	if (!dst || !rangeOK(src, n, dev, 1))
		RETURN(CUDA_ERROR_INVALID_VALUE);
	memcpy(dst, (const void *)(uintptr_t)src, n);
	queueWork(s);
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	ENTER(cuMemcpyDtoDAsync_v2);
	int dev = streamDev(s);
	if (dev < 0)
		RETURN(CUDA_ERROR_INVALID_HANDLE);
	if (!rangeOK(dst, n, dev, 3) || !rangeOK(src, n, dev, 1))
		RETURN(CUDA_ERROR_INVALID_VALUE);
	memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
	queueWork(s);
	RETURN(CUDA_SUCCESS);
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
	ENTER(cuMemsetD8Async);
	int dev = streamDev(s);
	if (dev < 0)
		RETURN(CUDA_ERROR_INVALID_HANDLE);
	if (!rangeOK(dst, n, dev, 3))
		RETURN(CUDA_ERROR_INVALID_VALUE);
	memset((void *)(uintptr_t)dst, v, n);
	queueWork(s);
	RETURN(CUDA_SUCCESS);
}

/* ---- control entry points for tests ---- */

static int symIndex(const char *name) {
	for (int i = 0; i < NSYM; i++)
		if (strcmp(symNames[i], name) == 0)
			return i;
	return -1;
}

/* fakecu_reset drops every object and restores the defaults: 2 devices of
 * 1 GiB, 2 MiB granularity, no faults, lenient contexts, zeroed counts. */
void fakecu_reset(void) {
	pthread_mutex_lock(&mu);
	while (mappings) {
		struct mapping *m = mappings;
		mappings = m->next;
		free(m);
	}
	while (reservations) {
		struct reservation *r = reservations;
		reservations = r->next;
		munmap((void *)r->va, r->size);
		free(r);
	}
	backingErrors = 0;
	backingWhy[0] = 0;
	while (handles) {
		struct handle *h = handles;
		handles = h->next;
		if (backingOK(h, "fakecu_reset"))
			close(h->fd);
		free(h);
	}
	while (streams) {
		struct stream *s = streams;
		streams = s->next;
		free(s);
	}
	while (events) {
		struct event *e = events;
		events = e->next;
		free(e);
	}
	while (hostblocks) {
		struct hostblock *b = hostblocks;
		hostblocks = b->next;
		if (!b->registered)
			free((void *)b->p);
		free(b);
	}
	memset(used, 0, sizeof used);
	memset(calls, 0, sizeof calls);
	for (int i = 0; i < MAXDEV; i++)
		ctxs[i].refs = 0;
	ndev = 2;
	granMin = granRec = 2 << 20;
	strictCtx = 0;
	nfaults = 0;
	guardPattern = 1;
	setDefaults();
	pthread_mutex_unlock(&mu);
}

/* fakecu_set_capacity sets device dev's memory (all devices if dev < 0). */
int fakecu_set_capacity(int dev, size_t bytes) {
	pthread_mutex_lock(&mu);
	int rc = 0;
	for (int i = 0; i < MAXDEV; i++)
		if (dev < 0 || dev == i) {
			if (bytes < used[i])
				rc = -1;
			else
				capacity[i] = bytes;
		}
	pthread_mutex_unlock(&mu);
	return rc;
}

int fakecu_set_device_count(int n) {
	if (n < 1 || n > MAXDEV)
		return -1;
	pthread_mutex_lock(&mu);
	ndev = n;
	pthread_mutex_unlock(&mu);
	return 0;
}

int fakecu_set_granularity(size_t minimum, size_t recommended) {
	if (minimum == 0 || (minimum & (minimum - 1)) != 0 || minimum % 4096 != 0 || recommended % minimum != 0)
		return -1;
	pthread_mutex_lock(&mu);
	granMin = minimum;
	granRec = recommended;
	pthread_mutex_unlock(&mu);
	return 0;
}

/* fakecu_require_context makes every memory, stream and event call fail with
 * CUDA_ERROR_INVALID_CONTEXT when the calling thread has no current context. */
void fakecu_require_context(int on) {
	pthread_mutex_lock(&mu);
	strictCtx = on;
	pthread_mutex_unlock(&mu);
}

/* fakecu_fail makes the nth next call (1 = the next one) of the named
 * symbol fail with code. It returns -1 for an unknown symbol. */
int fakecu_fail(const char *sym, int nth, int code) {
	int i = symIndex(sym);
	if (i < 0 || nth < 1)
		return -1;
	pthread_mutex_lock(&mu);
	if (nfaults == MAXFAULTS) {
		pthread_mutex_unlock(&mu);
		return -1;
	}
	faults[nfaults].sym = i;
	faults[nfaults].nth = nth;
	faults[nfaults].code = code;
	nfaults++;
	pthread_mutex_unlock(&mu);
	return 0;
}

/* fakecu_calls is the number of calls made to the named symbol (-1 if it is
 * unknown). */
long long fakecu_calls(const char *sym) {
	int i = symIndex(sym);
	if (i < 0)
		return -1;
	pthread_mutex_lock(&mu);
	long long n = calls[i];
	pthread_mutex_unlock(&mu);
	return n;
}

/* fakecu_hold makes work on stream s stay pending until fakecu_complete or
 * a synchronize; fakecu_launch queues one work item on s; fakecu_complete
 * completes the oldest n pending items of s. They return -1 for an unknown
 * stream. (Copies move their bytes at once either way.) */
int fakecu_hold(CUstream s) {
	pthread_mutex_lock(&mu);
	struct stream *x = findStream(s);
	if (x)
		x->held = 1;
	pthread_mutex_unlock(&mu);
	return x ? 0 : -1;
}

int fakecu_launch(CUstream s) {
	pthread_mutex_lock(&mu);
	struct stream *x = findStream(s);
	if (x)
		queueWork(s);
	pthread_mutex_unlock(&mu);
	return x ? 0 : -1;
}

int fakecu_complete(CUstream s, int n) {
	pthread_mutex_lock(&mu);
	struct stream *x = findStream(s);
	if (x) {
		uint64_t pending = x->queued - x->done;
		x->done += (uint64_t)n < pending ? (uint64_t)n : pending;
	}
	pthread_mutex_unlock(&mu);
	return x ? 0 : -1;
}

/* fakecu_backing_errors returns how many times since the last reset a
 * handle was found whose memfd had been closed or replaced behind the
 * double's back, and copies the first finding into why (n bytes, NUL
 * terminated). */
long long fakecu_backing_errors(char *why, size_t n) {
	pthread_mutex_lock(&mu);
	long long c = backingErrors;
	if (why && n > 0) {
		strncpy(why, backingWhy, n - 1);
		why[n - 1] = 0;
	}
	pthread_mutex_unlock(&mu);
	return c;
}

/* fakecu_live fills out[0..7] with the live objects: reservations, mappings,
 * handles (released-but-mapped included), streams, events, host blocks,
 * host registrations, and the bytes charged to all devices. */
void fakecu_live(long long out[8]) {
	pthread_mutex_lock(&mu);
	memset(out, 0, 8 * sizeof out[0]);
	for (struct reservation *r = reservations; r; r = r->next)
		out[0]++;
	for (struct mapping *m = mappings; m; m = m->next)
		out[1]++;
	for (struct handle *h = handles; h; h = h->next)
		out[2]++;
	for (struct stream *s = streams; s; s = s->next)
		out[3]++;
	for (struct event *e = events; e; e = e->next)
		out[4]++;
	for (struct hostblock *b = hostblocks; b; b = b->next)
		out[b->registered ? 6 : 5]++;
	for (int i = 0; i < MAXDEV; i++)
		out[7] += (long long)used[i];
	pthread_mutex_unlock(&mu);
}
