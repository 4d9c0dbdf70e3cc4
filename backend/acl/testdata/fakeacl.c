/*
 * fakeacl.c: a test double of libascendcl.so for vmmalloc's backend/acl.
 *
 * It exports the ACL runtime symbols the binding resolves, with the same C
 * ABI (argument order, struct layouts, enum values, aclError codes), over
 * real host memory:
 *
 *   reservation   mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE)
 *   physical      a memfd of the handle's size (struct phys), refcounted
 *   map           mmap(MAP_SHARED|MAP_FIXED) of the memfd, PROT_NONE until
 *                 aclrtMemSetAccess (the stricter of ACL and CUDA)
 *   unmap         the range goes back to an anonymous PROT_NONE mapping
 *   export        a u64 shareable with a pid whitelist; importers are other
 *                 loaded copies of this library ("processes"), connected by
 *                 fakeacl_connect, that map the same memfd
 *   streams       copies run synchronously at the call; work queued with
 *                 fakeacl_launch on a held stream stays pending until
 *                 fakeacl_complete or a synchronize, so events can be
 *                 incomplete
 *
 * It enforces the seed rules (R1-R19 of shared/reference/seed-rules.md) and
 * returns the aclError codes of the real runtime. The calling thread's
 * current context (aclrtSetDevice / aclrtSetCurrentContext) is thread-local;
 * in strict mode every call that needs one fails with
 * ACL_ERROR_RT_CONTEXT_NULL without it, and stream and event calls fail when
 * the current device is not the object's device.
 *
 * Control entry points (fakeacl_*) set capacity, devices, granularity and the
 * pid, inject a failure at the Nth call of a symbol, and count live objects.
 *
 * A phys's memfd is a number in the fd table the process shares with the
 * code under test: code that closes an fd it does not own can close it, and
 * the next memfd_create reuses the number, so the handle would silently map
 * other memory. Each phys records its memfd's st_dev and st_ino at create
 * and checks them at every map, export and free: a changed or closed backing
 * fails the call with ACL_ERROR_RT_INTERNAL_ERROR, prints why on stderr and
 * is counted for fakeacl_backing_errors. A free still drops the handle, but
 * the double never closes an fd that is no longer its own.
 *
 * One mutex (mu) guards all state of this copy. Calls into another copy
 * (peer lookup, phys release) are made without holding mu.
 *
 * No vendor code or header: every declaration is written from the public
 * API documentation.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int aclError;

enum {
	ACL_SUCCESS = 0,
	ACL_ERROR_INVALID_PARAM = 100000,
	ACL_ERROR_UNINITIALIZE = 100001,
	ACL_ERROR_REPEAT_INITIALIZE = 100002,
	ACL_ERROR_BAD_ALLOC = 200000,
	ACL_ERROR_RT_PARAM_INVALID = 107000,
	ACL_ERROR_RT_INVALID_DEVICEID = 107001,
	ACL_ERROR_RT_CONTEXT_NULL = 107002,
	ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000,
	ACL_ERROR_RT_MEMORY_ALLOCATION = 207001,
	ACL_ERROR_RT_NO_PERMISSION = 207006,
	ACL_ERROR_RT_INTERNAL_ERROR = 507000,
	ACL_ERROR_HOST_REGISTERED = 507910,
	ACL_ERROR_HOST_UNREGISTERED = 507911,
};

typedef struct { uint32_t id; int32_t type; } aclrtMemLocation;
typedef struct {
	int32_t handleType, allocationType, memAttr;
	aclrtMemLocation location;
	uint64_t reserve;
} aclrtPhysicalMemProp;
typedef struct { int32_t flags; aclrtMemLocation location; uint8_t rsv[12]; } aclrtMemAccessDesc;

_Static_assert(sizeof(aclrtMemLocation) == 8, "aclrtMemLocation");
_Static_assert(sizeof(aclrtPhysicalMemProp) == 32, "aclrtPhysicalMemProp");
_Static_assert(__builtin_offsetof(aclrtPhysicalMemProp, location) == 12, "location@12");
_Static_assert(__builtin_offsetof(aclrtPhysicalMemProp, reserve) == 24, "reserve@24");
_Static_assert(sizeof(aclrtMemAccessDesc) == 24, "aclrtMemAccessDesc");

enum { LOC_HOST = 0, LOC_DEVICE = 1 };
enum { DDR_MEM = 0, HBM_MEM = 1, DDR_HUGE = 2, DDR_NORMAL = 3, HBM_HUGE = 4, HBM_NORMAL = 5, HBM_HUGE1G = 10 };
enum { ACCESS_NONE = 0, ACCESS_READ = 1, ACCESS_RW = 3 };
enum { MEMCPY_H2H = 0, MEMCPY_H2D = 1, MEMCPY_D2H = 2, MEMCPY_D2D = 3 };
enum { HOSTREG_MAPPED = 0, HOSTREG_IOMEMORY = 4, HOSTREG_READONLY = 8 };

#define MAXDEV 8
#define MAXPIDS 64
#define GIB (1ull << 30)

/* ---- objects -------------------------------------------------------- */

/* phys is physical memory, shared by every copy that holds a handle to it.
 * Its owner (the copy that created it) accounts its size against the
 * device's capacity until the last reference is dropped through unref. */
struct phys {
	int fd;
	dev_t fd_dev; /* st_dev and st_ino of fd at create: the backing */
	ino_t fd_ino;
	uint64_t size;
	int dev;   /* physical device of the owner's allocation */
	int attr;  /* aclrtMemAttr */
	int loctype;
	int refs;  /* guarded by the owner's mu: handles in every copy */
	void (*unref)(struct phys *);
};

struct handle {
	struct handle *next;
	struct phys *phys;
	int refs;       /* creation/import + retains */
	int maps;
	int dev;        /* device the handle belongs to in this copy */
	int imported;
	uint64_t shareable; /* 0 until exported (or the imported one) */
};

struct export {
	struct export *next;
	uint64_t sh;
	struct handle *h;
	int validate;
	int npids;
	int32_t pids[MAXPIDS];
};

struct resv {
	struct resv *next;
	uintptr_t base;
	uint64_t size;
	uint64_t whole; /* size rounded up to the granularity: what is mmapped */
	int maps;
	int dev;      /* device of the mapped handles while maps > 0 */
	int imported; /* whether the mapped handles are imported */
};

struct mapping {
	struct mapping *next;
	uintptr_t va;
	uint64_t size;
	struct handle *h;
	struct resv *r;
	int access;
};

/* A stream's work items are numbered 1, 2, ...; those up to done have
 * completed. Copies and memsets run at the call; only fakeacl_launch queues
 * work, which completes at once unless the stream is held, and then by
 * fakeacl_complete or a synchronize call. */
struct stream { struct stream *next; int dev; int held; uint64_t issued, done; };
/* An event captures its stream's work up to seq when recorded. */
struct event { struct event *next; int dev; struct stream *s; uint64_t seq; };
struct hostblk { struct hostblk *next; uintptr_t p; uint64_t size; };
struct hostreg { struct hostreg *next; uintptr_t p; uint64_t size; };

typedef aclError (*lookup_fn)(uint64_t sh, int32_t pid, struct phys **out);

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static int ndev = 2;
static uint64_t capacity[MAXDEV] = {1 * GIB, 1 * GIB, 1 * GIB, 1 * GIB, 1 * GIB, 1 * GIB, 1 * GIB, 1 * GIB};
static uint64_t used[MAXDEV];
static uint64_t gran = 2u << 20;
static int32_t pid;
static int strict;
static uint64_t next_sh;
static struct handle *handles;
static struct export *exports;
static struct resv *resvs;
static struct mapping *mappings;
static struct stream *streams;
static struct event *events;
static struct hostblk *hostblks;
static struct hostreg *hostregs;
static lookup_fn peers[8];
static int npeers;
static long long calls;
static long long backing_errors; /* phys found with a changed backing */
static char backing_why[256];    /* the first such finding since cleared */

/* fault injection: the nth call (1-based) of symbol fail_sym returns code */
static char fail_sym[64];
static long fail_nth;
static aclError fail_code;

/* The calling thread's current context, a pointer into ctxs or NULL, as
 * aclrtSetDevice / aclrtSetCurrentContext left it; and the context of the
 * call in progress. In strict mode a call consumes the current context, so
 * that a binding must set it on the same thread right before every call and
 * cannot lean on what an earlier call left behind. */
static char ctxs[MAXDEV];
static __thread char *cur_ctx;
static __thread char *call_ctx;

static int cur_dev(void) { return call_ctx ? (int)(call_ctx - ctxs) : -1; }

/* enter takes mu, counts the call and applies fault injection. */
static aclError enter(const char *sym) {
	pthread_mutex_lock(&mu);
	calls++;
	call_ctx = cur_ctx;
	if (strict) cur_ctx = NULL;
	if (fail_nth > 0 && strcmp(sym, fail_sym) == 0 && --fail_nth == 0) {
		pthread_mutex_unlock(&mu);
		return fail_code;
	}
	if (!initialized) {
		pthread_mutex_unlock(&mu);
		return ACL_ERROR_UNINITIALIZE;
	}
	return ACL_SUCCESS;
}

/* need_ctx fails, in strict mode, a call made without a current context. */
static aclError need_ctx(void) {
	if (strict && call_ctx == NULL)
		return ACL_ERROR_RT_CONTEXT_NULL;
	return ACL_SUCCESS;
}

/* need_dev fails, in strict mode, a call on an object of device dev made
 * with another (or no) current device. */
static aclError need_dev(int dev) {
	if (strict && cur_dev() != dev)
		return ACL_ERROR_RT_CONTEXT_NULL;
	return ACL_SUCCESS;
}

#define ENTER(sym)                                    \
	do {                                          \
		aclError e_ = enter(sym);             \
		if (e_ != ACL_SUCCESS) return e_;     \
	} while (0)
/* ENTER_CTX is ENTER for the calls that set or read the current context */
#define ENTER_CTX(sym)                                \
	do {                                          \
		char *keep_ = cur_ctx;                \
		aclError e_ = enter(sym);             \
		cur_ctx = keep_;                      \
		if (e_ != ACL_SUCCESS) return e_;     \
	} while (0)
#define RET(code)                                     \
	do {                                          \
		aclError r_ = (code);                 \
		pthread_mutex_unlock(&mu);            \
		return r_;                            \
	} while (0)
#define CHECK(cond, code) \
	do { if (!(cond)) RET(code); } while (0)

static struct handle *find_handle(void *p) {
	for (struct handle *h = handles; h; h = h->next)
		if (h == p) return h;
	return NULL;
}

static struct resv *find_resv_containing(uintptr_t a, uint64_t n) {
	for (struct resv *r = resvs; r; r = r->next)
		if (a >= r->base && a - r->base < r->size && n <= r->size - (a - r->base))
			return r;
	return NULL;
}

static struct mapping *find_mapping(uintptr_t va) {
	for (struct mapping *m = mappings; m; m = m->next)
		if (va >= m->va && va - m->va < m->size) return m;
	return NULL;
}

static struct export *find_export(uint64_t sh) {
	for (struct export *x = exports; x; x = x->next)
		if (x->sh == sh) return x;
	return NULL;
}

static void unlink_handle(struct handle *h) {
	for (struct handle **pp = &handles; *pp; pp = &(*pp)->next)
		if (*pp == h) { *pp = h->next; return; }
}

/* backing_ok reports whether p's fd still names the memfd it was created
 * with. If not, someone closed the double's fd and the number may now name
 * other memory: it says so on stderr and counts it. Called with mu held. */
static int backing_ok(struct phys *p, const char *call) {
	struct stat st;
	if (fstat(p->fd, &st) == 0 && st.st_dev == p->fd_dev && st.st_ino == p->fd_ino)
		return 1;
	char why[sizeof backing_why];
	if (fcntl(p->fd, F_GETFD) < 0)
		snprintf(why, sizeof why, "%s: physical memory %p: its memfd (fd %d) was closed behind the double's back",
			call, (void *)p, p->fd);
	else
		snprintf(why, sizeof why, "%s: physical memory %p: its fd %d now names another file (inode %llu, was %llu): "
			"its memfd was closed behind the double's back and the number reused",
			call, (void *)p, p->fd, (unsigned long long)st.st_ino, (unsigned long long)p->fd_ino);
	fprintf(stderr, "fakeacl: BACKING CHANGED: %s (a caller closed a file descriptor it does not own)\n", why);
	if (backing_errors++ == 0)
		memcpy(backing_why, why, sizeof why);
	return 0;
}

/* phys_unref drops one reference; the owner frees the memfd and gives the
 * capacity back with the last one. Called without mu held. */
static void phys_unref(struct phys *p) {
	pthread_mutex_lock(&mu);
	if (--p->refs == 0) {
		if (backing_ok(p, "free")) /* never close an fd that is not ours any more */
			close(p->fd);
		used[p->dev] -= p->size;
		free(p);
	}
	pthread_mutex_unlock(&mu);
}

/* handle_drop is called with mu held when a handle has no reference and no
 * mapping left: it leaves the handle table and returns the phys reference
 * the caller must drop after unlocking. */
static struct phys *handle_drop(struct handle *h) {
	unlink_handle(h);
	for (struct export **pp = &exports; *pp;)
		if ((*pp)->h == h) {
			struct export *x = *pp;
			*pp = x->next;
			free(x);
		} else
			pp = &(*pp)->next;
	struct phys *p = h->phys;
	free(h);
	return p;
}

static int valid_dev(int d) { return d >= 0 && d < ndev; }

/* ---- control entry points ------------------------------------------- */

void fakeacl_set_devices(int n) {
	pthread_mutex_lock(&mu);
	if (n >= 1 && n <= MAXDEV) ndev = n;
	pthread_mutex_unlock(&mu);
}
void fakeacl_set_capacity(int dev, uint64_t bytes) {
	pthread_mutex_lock(&mu);
	if (dev >= 0 && dev < MAXDEV) capacity[dev] = bytes;
	pthread_mutex_unlock(&mu);
}
void fakeacl_set_granularity(uint64_t g) {
	pthread_mutex_lock(&mu);
	gran = g;
	pthread_mutex_unlock(&mu);
}
void fakeacl_set_pid(int32_t p) {
	pthread_mutex_lock(&mu);
	pid = p;
	pthread_mutex_unlock(&mu);
}
/* fakeacl_clear_context makes the calling thread have no current context. */
void fakeacl_clear_context(void) { cur_ctx = NULL; }

void fakeacl_set_strict(int on) {
	pthread_mutex_lock(&mu);
	strict = on;
	pthread_mutex_unlock(&mu);
}
/* fakeacl_fail makes the nth call (from now, 1-based) of symbol sym return
 * code; nth 0 disarms. */
void fakeacl_fail(const char *sym, long nth, int code) {
	pthread_mutex_lock(&mu);
	strncpy(fail_sym, sym, sizeof fail_sym - 1);
	fail_nth = nth;
	fail_code = code;
	pthread_mutex_unlock(&mu);
}
/* fakeacl_fail_armed is how many more calls of the armed symbol pass
 * before the injected failure: 0 once it has fired (or when disarmed). */
long fakeacl_fail_armed(void) {
	pthread_mutex_lock(&mu);
	long n = fail_nth;
	pthread_mutex_unlock(&mu);
	return n;
}

/* fakeacl_live reports the live objects of this copy, in the order:
 * reservations, mappings, handles, streams, events, host blocks, host
 * registrations, exports; and the bytes used on device 0.. in used_out. */
void fakeacl_live(int64_t out[8], uint64_t used_out[MAXDEV]) {
	pthread_mutex_lock(&mu);
	memset(out, 0, 8 * sizeof out[0]);
	for (struct resv *r = resvs; r; r = r->next) out[0]++;
	for (struct mapping *m = mappings; m; m = m->next) out[1]++;
	for (struct handle *h = handles; h; h = h->next) out[2]++;
	for (struct stream *s = streams; s; s = s->next) out[3]++;
	for (struct event *e = events; e; e = e->next) out[4]++;
	for (struct hostblk *b = hostblks; b; b = b->next) out[5]++;
	for (struct hostreg *g = hostregs; g; g = g->next) out[6]++;
	for (struct export *x = exports; x; x = x->next) out[7]++;
	for (int i = 0; i < MAXDEV; i++) used_out[i] = used[i];
	pthread_mutex_unlock(&mu);
}
/* fakeacl_backing_errors returns how many times a phys was found whose
 * memfd had been closed or replaced behind the double's back, and copies the
 * first finding into why (n bytes, NUL terminated); clear forgets them. */
long long fakeacl_backing_errors(char *why, size_t n, int clear) {
	pthread_mutex_lock(&mu);
	long long c = backing_errors;
	if (why && n > 0) {
		strncpy(why, backing_why, n - 1);
		why[n - 1] = 0;
	}
	if (clear) {
		backing_errors = 0;
		backing_why[0] = 0;
	}
	pthread_mutex_unlock(&mu);
	return c;
}

long long fakeacl_calls(void) {
	pthread_mutex_lock(&mu);
	long long n = calls;
	pthread_mutex_unlock(&mu);
	return n;
}

/* fakeacl_lookup is what another copy calls to import sh as importer pid:
 * it returns the phys with a new reference. */
aclError fakeacl_lookup(uint64_t sh, int32_t importer, struct phys **out) {
	pthread_mutex_lock(&mu);
	struct export *x = find_export(sh);
	if (x == NULL) RET(ACL_ERROR_INVALID_PARAM);
	if (x->validate) {
		int ok = 0;
		for (int i = 0; i < x->npids; i++)
			if (x->pids[i] == importer) ok = 1;
		if (!ok) RET(ACL_ERROR_RT_NO_PERMISSION); /* R16 */
	}
	x->h->phys->refs++;
	*out = x->h->phys;
	RET(ACL_SUCCESS);
}

/* fakeacl_connect lets this copy import what the copy whose fakeacl_lookup
 * is fn exported. */
void fakeacl_connect(lookup_fn fn) {
	pthread_mutex_lock(&mu);
	if (npeers < 8) peers[npeers++] = fn;
	pthread_mutex_unlock(&mu);
}

/* ---- init and devices ----------------------------------------------- */

aclError aclInit(const char *config) {
	(void)config;
	pthread_mutex_lock(&mu);
	calls++;
	if (pid == 0) pid = (int32_t)getpid();
	if (initialized) RET(ACL_ERROR_REPEAT_INITIALIZE);
	initialized = 1;
	RET(ACL_SUCCESS);
}

aclError aclFinalize(void) {
	ENTER("aclFinalize");
	initialized = 0;
	RET(ACL_SUCCESS);
}

aclError aclrtGetDeviceCount(uint32_t *n) {
	ENTER("aclrtGetDeviceCount");
	CHECK(n != NULL, ACL_ERROR_INVALID_PARAM);
	*n = (uint32_t)ndev;
	RET(ACL_SUCCESS);
}

aclError aclrtSetDevice(int32_t dev) {
	ENTER_CTX("aclrtSetDevice");
	CHECK(valid_dev(dev), ACL_ERROR_RT_INVALID_DEVICEID);
	cur_ctx = &ctxs[dev];
	RET(ACL_SUCCESS);
}

aclError aclrtGetDevice(int32_t *dev) {
	ENTER_CTX("aclrtGetDevice");
	CHECK(dev != NULL, ACL_ERROR_INVALID_PARAM);
	CHECK(cur_ctx != NULL, ACL_ERROR_RT_CONTEXT_NULL);
	*dev = cur_dev();
	RET(ACL_SUCCESS);
}

aclError aclrtGetCurrentContext(void **ctx) {
	ENTER_CTX("aclrtGetCurrentContext");
	CHECK(ctx != NULL, ACL_ERROR_INVALID_PARAM);
	CHECK(cur_ctx != NULL, ACL_ERROR_RT_CONTEXT_NULL);
	*ctx = cur_ctx;
	RET(ACL_SUCCESS);
}

aclError aclrtSetCurrentContext(void *ctx) {
	ENTER_CTX("aclrtSetCurrentContext");
	char *c = ctx;
	CHECK(c >= ctxs && c < ctxs + ndev, ACL_ERROR_INVALID_PARAM);
	cur_ctx = c;
	RET(ACL_SUCCESS);
}

aclError aclrtDeviceGetBareTgid(int32_t *p) {
	ENTER("aclrtDeviceGetBareTgid");
	CHECK(p != NULL, ACL_ERROR_INVALID_PARAM);
	*p = pid;
	RET(ACL_SUCCESS);
}

aclError aclrtGetMemInfo(int32_t attr, size_t *freeb, size_t *total) {
	ENTER("aclrtGetMemInfo");
	CHECK(freeb != NULL && total != NULL, ACL_ERROR_INVALID_PARAM);
	CHECK(call_ctx != NULL, ACL_ERROR_RT_CONTEXT_NULL); /* per device: always needs one */
	CHECK(attr == HBM_MEM, ACL_ERROR_INVALID_PARAM);
	int d = cur_dev();
	*total = capacity[d];
	*freeb = capacity[d] - used[d];
	RET(ACL_SUCCESS);
}

/* ---- physical memory -------------------------------------------------- */

/* prop_granularity validates a prop (R2) and returns its granularity, or 0. */
static uint64_t prop_granularity(const aclrtPhysicalMemProp *p) {
	if (p->handleType != 0 || p->allocationType != 0 || p->reserve != 0) return 0;
	switch (p->location.type) {
	case LOC_DEVICE:
		if (!valid_dev((int)p->location.id)) return 0;
		switch (p->memAttr) {
		case HBM_HUGE: case HBM_NORMAL: return gran;
		case HBM_HUGE1G: return GIB;
		}
		return 0;
	case LOC_HOST:
		switch (p->memAttr) {
		case DDR_HUGE: case DDR_NORMAL: return gran;
		}
		return 0;
	}
	return 0;
}

aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop, int32_t opt, size_t *g) {
	ENTER("aclrtMemGetAllocationGranularity");
	CHECK(prop != NULL && g != NULL, ACL_ERROR_INVALID_PARAM);
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	CHECK(opt == 0 || opt == 1, ACL_ERROR_INVALID_PARAM); /* R11 */
	uint64_t pg = prop_granularity(prop);
	CHECK(pg != 0, ACL_ERROR_INVALID_PARAM);
	*g = pg;
	RET(ACL_SUCCESS);
}

aclError aclrtMallocPhysical(void **out, size_t size, const aclrtPhysicalMemProp *prop, uint64_t flags) {
	ENTER("aclrtMallocPhysical");
	CHECK(out != NULL && prop != NULL, ACL_ERROR_INVALID_PARAM);
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	CHECK(flags == 0, ACL_ERROR_INVALID_PARAM); /* R1 */
	uint64_t pg = prop_granularity(prop);
	CHECK(pg != 0, ACL_ERROR_INVALID_PARAM);                   /* R2 */
	CHECK(size != 0 && size % pg == 0, ACL_ERROR_INVALID_PARAM); /* R1 */
	/* host memory is accounted on device 0's counter (there is one host) */
	int d = prop->location.type == LOC_DEVICE ? (int)prop->location.id : 0;
	CHECK(size <= capacity[d] - used[d], ACL_ERROR_RT_MEMORY_ALLOCATION);
	int fd = memfd_create("fakeacl", MFD_CLOEXEC);
	CHECK(fd >= 0, ACL_ERROR_RT_INTERNAL_ERROR);
	if (ftruncate(fd, (off_t)size) != 0) {
		close(fd);
		RET(ACL_ERROR_RT_INTERNAL_ERROR);
	}
	struct phys *p = calloc(1, sizeof *p);
	struct handle *h = calloc(1, sizeof *h);
	if (!p || !h) {
		free(p), free(h), close(fd);
		RET(ACL_ERROR_BAD_ALLOC);
	}
	struct stat st;
	if (fstat(fd, &st) != 0) {
		free(p), free(h), close(fd);
		RET(ACL_ERROR_RT_INTERNAL_ERROR);
	}
	*p = (struct phys){.fd = fd, .fd_dev = st.st_dev, .fd_ino = st.st_ino, .size = size, .dev = d,
		.attr = prop->memAttr, .loctype = prop->location.type, .refs = 1, .unref = phys_unref};
	*h = (struct handle){.next = handles, .phys = p, .refs = 1, .dev = d};
	handles = h;
	used[d] += size;
	*out = h;
	RET(ACL_SUCCESS);
}

aclError aclrtFreePhysical(void *hp) {
	ENTER("aclrtFreePhysical");
	struct handle *h = find_handle(hp);
	CHECK(h != NULL && h->refs > 0, ACL_ERROR_INVALID_PARAM);
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	int ok = backing_ok(h->phys, "aclrtFreePhysical");
	struct phys *p = NULL;
	if (--h->refs == 0 && h->maps == 0) /* R3: deferred while mapped */
		p = handle_drop(h);
	pthread_mutex_unlock(&mu);
	if (p) p->unref(p);
	return ok ? ACL_SUCCESS : ACL_ERROR_RT_INTERNAL_ERROR;
}

aclError aclrtMemGetAllocationPropertiesFromHandle(void *hp, aclrtPhysicalMemProp *prop) {
	ENTER("aclrtMemGetAllocationPropertiesFromHandle");
	struct handle *h = find_handle(hp);
	CHECK(h != NULL && h->refs > 0 && prop != NULL, ACL_ERROR_INVALID_PARAM); /* R13 */
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	memset(prop, 0, sizeof *prop);
	prop->memAttr = h->phys->attr;
	prop->location.type = h->phys->loctype;
	prop->location.id = (uint32_t)h->dev;
	RET(ACL_SUCCESS);
}

/* ---- address space ---------------------------------------------------- */

aclError aclrtReserveMemAddress(void **va, size_t size, size_t align, void *expect, uint64_t flags) {
	ENTER("aclrtReserveMemAddress");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	/* R4: size != 0, alignment 0, system-chosen address; flags 0 or 1 */
	CHECK(va != NULL && size != 0 && align == 0 && expect == NULL && flags <= 1, ACL_ERROR_INVALID_PARAM);
	/* over-reserve to align the base to the granularity; the tail up to
	 * the next granule stays reserved too */
	size_t whole = (size + gran - 1) / gran * gran;
	size_t over = whole + gran;
	char *m = mmap(NULL, over, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	CHECK(m != MAP_FAILED, ACL_ERROR_RT_MEMORY_ALLOCATION);
	uintptr_t base = ((uintptr_t)m + gran - 1) & ~(uintptr_t)(gran - 1);
	if (base > (uintptr_t)m) munmap(m, base - (uintptr_t)m);
	uintptr_t end = (uintptr_t)m + over;
	if (end > base + whole) munmap((void *)(base + whole), end - (base + whole));
	struct resv *r = calloc(1, sizeof *r);
	if (!r) {
		munmap((void *)base, whole);
		RET(ACL_ERROR_BAD_ALLOC);
	}
	*r = (struct resv){.next = resvs, .base = base, .size = size, .whole = whole};
	resvs = r;
	*va = (void *)base;
	RET(ACL_SUCCESS);
}

aclError aclrtReleaseMemAddress(void *va) {
	ENTER("aclrtReleaseMemAddress");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	for (struct resv **pp = &resvs; *pp; pp = &(*pp)->next) {
		struct resv *r = *pp;
		if (r->base != (uintptr_t)va) continue;
		CHECK(r->maps == 0, ACL_ERROR_INVALID_PARAM); /* R5 */
		munmap((void *)r->base, r->whole);
		*pp = r->next;
		free(r);
		RET(ACL_SUCCESS);
	}
	RET(ACL_ERROR_INVALID_PARAM);
}

aclError aclrtMapMem(void *vp, size_t size, size_t offset, void *hp, uint64_t flags) {
	ENTER("aclrtMapMem");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	uintptr_t va = (uintptr_t)vp;
	struct handle *h = find_handle(hp);
	CHECK(h != NULL && h->refs > 0, ACL_ERROR_INVALID_PARAM);
	/* R6: whole handle at offset 0, flags 0, granule-aligned VA inside a
	 * reservation, not overlapping another mapping */
	CHECK(offset == 0 && flags == 0 && size == h->phys->size, ACL_ERROR_INVALID_PARAM);
	CHECK(va % gran == 0, ACL_ERROR_INVALID_PARAM);
	struct resv *r = find_resv_containing(va, size);
	CHECK(r != NULL, ACL_ERROR_INVALID_PARAM);
	for (struct mapping *m = mappings; m; m = m->next)
		CHECK(va + size <= m->va || m->va + m->size <= va, ACL_ERROR_INVALID_PARAM);
	/* R7: one device, and local or imported, per reservation */
	CHECK(r->maps == 0 || (r->dev == h->dev && r->imported == h->imported), ACL_ERROR_INVALID_PARAM);
	CHECK(backing_ok(h->phys, "aclrtMapMem"), ACL_ERROR_RT_INTERNAL_ERROR);
	struct mapping *m = calloc(1, sizeof *m);
	CHECK(m != NULL, ACL_ERROR_BAD_ALLOC);
	/* R8: inaccessible until aclrtMemSetAccess */
	void *got = mmap((void *)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->phys->fd, 0);
	if (got == MAP_FAILED) {
		free(m);
		RET(ACL_ERROR_RT_INTERNAL_ERROR);
	}
	*m = (struct mapping){.next = mappings, .va = va, .size = size, .h = h, .r = r};
	mappings = m;
	r->maps++;
	r->dev = h->dev;
	r->imported = h->imported;
	h->maps++;
	RET(ACL_SUCCESS);
}

aclError aclrtUnmapMem(void *vp) {
	ENTER("aclrtUnmapMem");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	uintptr_t va = (uintptr_t)vp;
	for (struct mapping **pp = &mappings; *pp; pp = &(*pp)->next) {
		struct mapping *m = *pp;
		if (m->va != va) continue; /* R9: the mapping's VA only */
		void *got = mmap((void *)va, m->size, PROT_NONE,
			MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
		CHECK(got != MAP_FAILED, ACL_ERROR_RT_INTERNAL_ERROR);
		*pp = m->next;
		m->r->maps--;
		struct handle *h = m->h;
		free(m);
		struct phys *p = NULL;
		if (--h->maps == 0 && h->refs == 0) /* R3: the deferred free */
			p = handle_drop(h);
		pthread_mutex_unlock(&mu);
		if (p) p->unref(p);
		return ACL_SUCCESS;
	}
	RET(ACL_ERROR_INVALID_PARAM);
}

aclError aclrtMemSetAccess(void *vp, size_t size, aclrtMemAccessDesc *desc, size_t count) {
	ENTER("aclrtMemSetAccess");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	CHECK(desc != NULL && count >= 1, ACL_ERROR_INVALID_PARAM);
	struct mapping *m = find_mapping((uintptr_t)vp);
	/* R10: exactly one mapping */
	CHECK(m != NULL && m->va == (uintptr_t)vp && m->size == size, ACL_ERROR_INVALID_PARAM);
	int flags = -1;
	for (size_t i = 0; i < count; i++) {
		CHECK(desc[i].flags == ACCESS_NONE || desc[i].flags == ACCESS_READ || desc[i].flags == ACCESS_RW,
			ACL_ERROR_INVALID_PARAM);
		CHECK((desc[i].location.type == LOC_DEVICE && valid_dev((int)desc[i].location.id)) ||
			desc[i].location.type == LOC_HOST, ACL_ERROR_INVALID_PARAM);
		if (desc[i].location.type == LOC_DEVICE && (int)desc[i].location.id == m->h->dev)
			flags = desc[i].flags;
	}
	if (flags < 0) /* a grant to peers only leaves the owner's access as it is */
		RET(ACL_SUCCESS);
	int prot = flags == ACCESS_RW ? PROT_READ | PROT_WRITE : flags == ACCESS_READ ? PROT_READ : PROT_NONE;
	CHECK(mprotect((void *)m->va, m->size, prot) == 0, ACL_ERROR_RT_INTERNAL_ERROR);
	m->access = flags;
	RET(ACL_SUCCESS);
}

aclError aclrtMemGetAccess(void *vp, aclrtMemLocation *loc, uint64_t *flags) {
	ENTER("aclrtMemGetAccess");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	CHECK(loc != NULL && flags != NULL, ACL_ERROR_INVALID_PARAM);
	CHECK(loc->type == LOC_DEVICE || loc->type == LOC_HOST, ACL_ERROR_INVALID_PARAM);
	struct mapping *m = find_mapping((uintptr_t)vp);
	CHECK(m != NULL && m->va == (uintptr_t)vp, ACL_ERROR_INVALID_PARAM); /* R10: the MapMem address */
	*flags = (uint64_t)m->access;
	RET(ACL_SUCCESS);
}

aclError aclrtMemGetAddressRange(void *vp, void **base, size_t *size) {
	ENTER("aclrtMemGetAddressRange");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	struct mapping *m = find_mapping((uintptr_t)vp); /* R14 */
	CHECK(m != NULL, ACL_ERROR_INVALID_PARAM);
	if (base) *base = (void *)m->va;
	if (size) *size = m->size;
	RET(ACL_SUCCESS);
}

aclError aclrtMemRetainAllocationHandle(void *vp, void **out) {
	ENTER("aclrtMemRetainAllocationHandle");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	CHECK(out != NULL, ACL_ERROR_INVALID_PARAM);
	struct mapping *m = find_mapping((uintptr_t)vp);
	CHECK(m != NULL, ACL_ERROR_INVALID_PARAM);
	m->h->refs++; /* R12: needs its own aclrtFreePhysical */
	*out = m->h;
	RET(ACL_SUCCESS);
}

/* ---- IPC -------------------------------------------------------------- */

aclError aclrtMemExportToShareableHandle(void *hp, int32_t type, uint64_t flags, uint64_t *out) {
	ENTER("aclrtMemExportToShareableHandle");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	struct handle *h = find_handle(hp);
	CHECK(h != NULL && h->refs > 0 && out != NULL, ACL_ERROR_INVALID_PARAM);
	CHECK(type == 0 && flags <= 1, ACL_ERROR_INVALID_PARAM);
	CHECK(!h->imported && h->shareable == 0, ACL_ERROR_INVALID_PARAM); /* R15: 1:1 */
	CHECK(backing_ok(h->phys, "aclrtMemExportToShareableHandle"), ACL_ERROR_RT_INTERNAL_ERROR);
	struct export *x = calloc(1, sizeof *x);
	CHECK(x != NULL, ACL_ERROR_BAD_ALLOC);
	x->sh = ((uint64_t)(uint32_t)pid << 32) | ++next_sh;
	x->h = h;
	x->validate = flags == 0; /* R15: DEFAULT checks the whitelist */
	x->next = exports;
	exports = x;
	h->shareable = x->sh;
	*out = x->sh;
	RET(ACL_SUCCESS);
}

aclError aclrtMemSetPidToShareableHandle(uint64_t sh, int32_t *pids, size_t n) {
	ENTER("aclrtMemSetPidToShareableHandle");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	struct export *x = find_export(sh);
	CHECK(x != NULL && pids != NULL && n >= 1, ACL_ERROR_INVALID_PARAM);
	CHECK(x->npids + n <= MAXPIDS, ACL_ERROR_INVALID_PARAM);
	for (size_t i = 0; i < n; i++) x->pids[x->npids++] = pids[i]; /* R16 */
	RET(ACL_SUCCESS);
}

aclError aclrtMemImportFromShareableHandle(uint64_t sh, int32_t dev, void **out) {
	ENTER("aclrtMemImportFromShareableHandle");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	CHECK(out != NULL && valid_dev(dev), ACL_ERROR_INVALID_PARAM);
	CHECK(find_export(sh) == NULL, ACL_ERROR_INVALID_PARAM); /* R17: not in the exporting process */
	for (struct handle *h = handles; h; h = h->next)
		CHECK(!(h->imported && h->shareable == sh), ACL_ERROR_INVALID_PARAM); /* R15 */
	int32_t me = pid;
	lookup_fn ps[8];
	int np = npeers;
	memcpy(ps, peers, sizeof ps);
	pthread_mutex_unlock(&mu);

	struct phys *p = NULL;
	aclError rc = ACL_ERROR_INVALID_PARAM; /* R17: nobody exported sh */
	for (int i = 0; i < np && p == NULL; i++) {
		aclError r = ps[i](sh, me, &p);
		if (r != ACL_ERROR_INVALID_PARAM) rc = r;
	}
	if (p == NULL) return rc;

	pthread_mutex_lock(&mu);
	struct handle *h = calloc(1, sizeof *h);
	if (h == NULL) {
		pthread_mutex_unlock(&mu);
		p->unref(p);
		return ACL_ERROR_BAD_ALLOC;
	}
	*h = (struct handle){.next = handles, .phys = p, .refs = 1, .dev = dev, .imported = 1, .shareable = sh};
	handles = h;
	*out = h;
	RET(ACL_SUCCESS);
}

/* ---- streams and events ------------------------------------------------ */

aclError aclrtCreateStream(void **out) {
	ENTER("aclrtCreateStream");
	CHECK(out != NULL, ACL_ERROR_INVALID_PARAM);
	CHECK(call_ctx != NULL, ACL_ERROR_RT_CONTEXT_NULL); /* a stream belongs to the current device */
	struct stream *s = calloc(1, sizeof *s);
	CHECK(s != NULL, ACL_ERROR_BAD_ALLOC);
	s->dev = cur_dev();
	s->next = streams;
	streams = s;
	*out = s;
	RET(ACL_SUCCESS);
}

static struct stream *find_stream(void *p) {
	for (struct stream *s = streams; s; s = s->next)
		if (s == p) return s;
	return NULL;
}

static struct event *find_event(void *p) {
	for (struct event *e = events; e; e = e->next)
		if (e == p) return e;
	return NULL;
}

aclError aclrtDestroyStream(void *sp) {
	ENTER("aclrtDestroyStream");
	struct stream *s = find_stream(sp);
	CHECK(s != NULL, ACL_ERROR_INVALID_PARAM);
	CHECK(need_dev(s->dev) == 0, ACL_ERROR_RT_CONTEXT_NULL);
	for (struct stream **pp = &streams; *pp; pp = &(*pp)->next)
		if (*pp == s) { *pp = s->next; break; }
	for (struct event *e = events; e; e = e->next) /* its work completes */
		if (e->s == s) e->s = NULL;
	free(s);
	RET(ACL_SUCCESS);
}

aclError aclrtSynchronizeStream(void *sp) {
	ENTER("aclrtSynchronizeStream");
	struct stream *s = find_stream(sp);
	CHECK(s != NULL, ACL_ERROR_INVALID_PARAM);
	CHECK(need_dev(s->dev) == 0, ACL_ERROR_RT_CONTEXT_NULL);
	s->done = s->issued;
	RET(ACL_SUCCESS);
}

aclError aclrtSynchronizeDevice(void) {
	ENTER("aclrtSynchronizeDevice");
	CHECK(call_ctx != NULL, ACL_ERROR_RT_CONTEXT_NULL);
	for (struct stream *s = streams; s; s = s->next)
		if (s->dev == cur_dev()) s->done = s->issued;
	RET(ACL_SUCCESS);
}

aclError aclrtCreateEventWithFlag(void **out, uint32_t flag) {
	ENTER("aclrtCreateEventWithFlag");
	CHECK(out != NULL && flag != 0 && (flag & ~0xbu) == 0, ACL_ERROR_INVALID_PARAM);
	CHECK(call_ctx != NULL, ACL_ERROR_RT_CONTEXT_NULL);
	struct event *e = calloc(1, sizeof *e);
	CHECK(e != NULL, ACL_ERROR_BAD_ALLOC);
	e->dev = cur_dev();
	e->next = events;
	events = e;
	*out = e;
	RET(ACL_SUCCESS);
}

aclError aclrtDestroyEvent(void *ep) {
	ENTER("aclrtDestroyEvent");
	struct event *e = find_event(ep);
	CHECK(e != NULL, ACL_ERROR_INVALID_PARAM);
	CHECK(need_dev(e->dev) == 0, ACL_ERROR_RT_CONTEXT_NULL);
	for (struct event **pp = &events; *pp; pp = &(*pp)->next)
		if (*pp == e) { *pp = e->next; break; }
	free(e);
	RET(ACL_SUCCESS);
}

aclError aclrtRecordEvent(void *ep, void *sp) {
	ENTER("aclrtRecordEvent");
	struct event *e = find_event(ep);
	struct stream *s = find_stream(sp);
	CHECK(e != NULL && s != NULL && e->dev == s->dev, ACL_ERROR_INVALID_PARAM);
	CHECK(need_dev(s->dev) == 0, ACL_ERROR_RT_CONTEXT_NULL);
	e->s = s;
	e->seq = s->issued;
	RET(ACL_SUCCESS);
}

aclError aclrtQueryEventStatus(void *ep, int32_t *status) {
	ENTER("aclrtQueryEventStatus");
	struct event *e = find_event(ep);
	CHECK(e != NULL && status != NULL, ACL_ERROR_INVALID_PARAM);
	CHECK(need_dev(e->dev) == 0, ACL_ERROR_RT_CONTEXT_NULL);
	/* ACL_EVENT_RECORDED_STATUS_COMPLETE 1, NOT_READY 0; an event never
	 * recorded is complete */
	*status = e->s == NULL || e->seq <= e->s->done;
	RET(ACL_SUCCESS);
}

aclError aclrtSynchronizeEvent(void *ep) {
	ENTER("aclrtSynchronizeEvent");
	struct event *e = find_event(ep);
	CHECK(e != NULL, ACL_ERROR_INVALID_PARAM);
	CHECK(need_dev(e->dev) == 0, ACL_ERROR_RT_CONTEXT_NULL);
	if (e->s != NULL && e->s->done < e->seq) e->s->done = e->seq;
	RET(ACL_SUCCESS);
}

/* fakeacl_hold makes work launched on stream sp stay pending until
 * fakeacl_complete or a synchronize call. */
aclError fakeacl_hold(void *sp) {
	pthread_mutex_lock(&mu);
	struct stream *s = find_stream(sp);
	CHECK(s != NULL, ACL_ERROR_INVALID_PARAM);
	s->held = 1;
	RET(ACL_SUCCESS);
}

/* fakeacl_launch queues one work item on stream sp. */
aclError fakeacl_launch(void *sp) {
	pthread_mutex_lock(&mu);
	struct stream *s = find_stream(sp);
	CHECK(s != NULL, ACL_ERROR_INVALID_PARAM);
	s->issued++;
	if (!s->held) s->done = s->issued;
	RET(ACL_SUCCESS);
}

/* fakeacl_complete completes the oldest n pending work items of sp. */
aclError fakeacl_complete(void *sp, int n) {
	pthread_mutex_lock(&mu);
	struct stream *s = find_stream(sp);
	CHECK(s != NULL && n >= 0, ACL_ERROR_INVALID_PARAM);
	s->done = s->done + (uint64_t)n > s->issued ? s->issued : s->done + (uint64_t)n;
	RET(ACL_SUCCESS);
}

/* ---- data ------------------------------------------------------------- */

/* device_range reports whether [a, a+n) is covered by adjacent mappings
 * granting at least want (ACCESS_READ or ACCESS_RW). */
static int device_range(uintptr_t a, uint64_t n, int want) {
	while (n > 0) {
		struct mapping *m = find_mapping(a);
		if (m == NULL || (m->access & want) != want) return 0;
		uint64_t take = m->va + m->size - a;
		if (take >= n) return 1;
		a += take, n -= take;
	}
	return 1;
}

aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t n, int32_t kind, void *sp) {
	ENTER("aclrtMemcpyAsync");
	struct stream *s = find_stream(sp);
	CHECK(s != NULL && dst != NULL && src != NULL && n != 0 && n <= destMax, ACL_ERROR_INVALID_PARAM);
	CHECK(need_dev(s->dev) == 0, ACL_ERROR_RT_CONTEXT_NULL);
	int dd = kind == MEMCPY_H2D || kind == MEMCPY_D2D;
	int sd = kind == MEMCPY_D2H || kind == MEMCPY_D2D;
	CHECK(kind >= MEMCPY_H2D && kind <= MEMCPY_D2D, ACL_ERROR_INVALID_PARAM);
	CHECK(!dd || device_range((uintptr_t)dst, n, ACCESS_RW), ACL_ERROR_INVALID_PARAM);
	CHECK(!sd || device_range((uintptr_t)src, n, ACCESS_READ), ACL_ERROR_INVALID_PARAM);
	memmove(dst, src, n);
	RET(ACL_SUCCESS);
}

aclError aclrtMemsetAsync(void *dst, size_t destMax, int32_t value, size_t n, void *sp) {
	ENTER("aclrtMemsetAsync");
	struct stream *s = find_stream(sp);
	CHECK(s != NULL && dst != NULL && n != 0 && n <= destMax, ACL_ERROR_INVALID_PARAM);
	CHECK(need_dev(s->dev) == 0, ACL_ERROR_RT_CONTEXT_NULL);
	CHECK(device_range((uintptr_t)dst, n, ACCESS_RW), ACL_ERROR_INVALID_PARAM);
	memset(dst, value, n);
	RET(ACL_SUCCESS);
}

/* ---- host memory (R18, R19) -------------------------------------------- */

aclError aclrtMallocHost(void **out, size_t size) {
	ENTER("aclrtMallocHost");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	CHECK(out != NULL && size != 0, ACL_ERROR_INVALID_PARAM);
	struct hostblk *b = calloc(1, sizeof *b);
	CHECK(b != NULL, ACL_ERROR_BAD_ALLOC);
	void *p = NULL;
	if (posix_memalign(&p, 4096, size) != 0) {
		free(b);
		RET(ACL_ERROR_RT_MEMORY_ALLOCATION);
	}
	*b = (struct hostblk){.next = hostblks, .p = (uintptr_t)p, .size = size};
	hostblks = b;
	*out = p;
	RET(ACL_SUCCESS);
}

static aclError free_host(const char *sym, void *p) {
	ENTER(sym);
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	for (struct hostblk **pp = &hostblks; *pp; pp = &(*pp)->next) {
		struct hostblk *b = *pp;
		if (b->p != (uintptr_t)p) continue;
		for (struct hostreg *g = hostregs; g; g = g->next)
			CHECK(g->p < b->p || g->p >= b->p + b->size, ACL_ERROR_INVALID_PARAM);
		*pp = b->next;
		free(p);
		free(b);
		RET(ACL_SUCCESS);
	}
	RET(ACL_ERROR_INVALID_PARAM);
}

aclError aclrtFreeHost(void *p) { return free_host("aclrtFreeHost", p); }
/* work runs at the call, so there is never device work left to wait for */
aclError aclrtFreeHostWithDevSync(void *p) { return free_host("aclrtFreeHostWithDevSync", p); }

aclError aclrtHostRegister(void *p, uint64_t size, int32_t type, void **dev) {
	ENTER("aclrtHostRegister");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	CHECK(p != NULL && size != 0 && dev != NULL, ACL_ERROR_INVALID_PARAM);
	CHECK((uintptr_t)p % 4096 == 0, ACL_ERROR_INVALID_PARAM); /* R19 */
	CHECK(type == HOSTREG_MAPPED, type == HOSTREG_IOMEMORY || type == HOSTREG_READONLY
		? ACL_ERROR_RT_FEATURE_NOT_SUPPORT : ACL_ERROR_INVALID_PARAM);
	for (struct hostreg *g = hostregs; g; g = g->next)
		CHECK((uintptr_t)p + size <= g->p || g->p + g->size <= (uintptr_t)p, ACL_ERROR_HOST_REGISTERED);
	struct hostreg *g = calloc(1, sizeof *g);
	CHECK(g != NULL, ACL_ERROR_BAD_ALLOC);
	*g = (struct hostreg){.next = hostregs, .p = (uintptr_t)p, .size = size};
	hostregs = g;
	*dev = p; /* unified addressing */
	RET(ACL_SUCCESS);
}

aclError aclrtHostGetDevicePointer(void *p, void **dev, uint32_t flag) {
	ENTER("aclrtHostGetDevicePointer");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	CHECK(dev != NULL && flag == 0, ACL_ERROR_INVALID_PARAM);
	for (struct hostreg *g = hostregs; g; g = g->next)
		if ((uintptr_t)p >= g->p && (uintptr_t)p < g->p + g->size) {
			*dev = p;
			RET(ACL_SUCCESS);
		}
	RET(ACL_ERROR_HOST_UNREGISTERED);
}

aclError aclrtHostUnregister(void *p) {
	ENTER("aclrtHostUnregister");
	CHECK(need_ctx() == 0, ACL_ERROR_RT_CONTEXT_NULL);
	for (struct hostreg **pp = &hostregs; *pp; pp = &(*pp)->next) {
		struct hostreg *g = *pp;
		if (g->p != (uintptr_t)p) continue;
		*pp = g->next;
		free(g);
		RET(ACL_SUCCESS);
	}
	RET(ACL_ERROR_HOST_UNREGISTERED);
}
