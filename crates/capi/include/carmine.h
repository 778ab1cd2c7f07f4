/*
 * libcarmine: the Carmine block-volume client, in process.
 *
 * Modelled on librbd's C API: connect a cluster handle, open images by name, and read,
 * write, discard, write zeroes and flush them, synchronously or asynchronously.
 *
 *   carmine_cluster_t *cl;  carmine_image_t *img;
 *   carmine_create(&cl);
 *   carmine_conf_set(cl, "cluster_dir", "/var/lib/carmine/c1");
 *   carmine_connect(cl);
 *   carmine_open(cl, "vol1", &img);
 *   carmine_write(img, 0, 4096, buf);
 *   carmine_close(img);
 *   carmine_shutdown(cl);
 *
 * Errors: every call that can fail returns a negative errno (or NULL); carmine_strerror()
 * names it, and carmine_last_error() says why the last failing call on this thread failed
 * (with names and numbers: "opening \"vol1\": image \"vol1\" is in use: locked by ...").
 *
 * Threads and safety:
 *  - By default the library runs its own reactor thread ("reactors" option); requests are
 *    handed to it through a bounded lock-free queue. A caller blocks only in a synchronous
 *    call, in carmine_aio_wait_for_complete, or while the queue is full ("queue_depth").
 *  - Configure and connect a cluster handle from one thread. After carmine_connect, a
 *    cluster handle and its image handles may be used from any number of threads at once.
 *  - Inline mode ("reactors" = "0"): the client runs on the thread that connected the handle,
 *    with no handoff between threads (the fastest, for callers with an event loop of their
 *    own, like fio). Only that thread may use the handle and its images (others get
 *    -EINVAL), and requests progress only while it is inside the library: in carmine_run(),
 *    a synchronous call, or carmine_aio_wait_for_complete. Callbacks then run on it too.
 *    That includes renewing image locks: call in at least every third of lock_lease_ms, or
 *    another client may break the lock (this handle's writes then fail with -ESHUTDOWN).
 *  - carmine_close, carmine_shutdown and carmine_aio_release free their argument: no other
 *    thread may use it during or after the call. Close every image before shutting its
 *    cluster down (a shutdown closes any still open; their handles then only fail).
 *  - Buffers: a write's buffer is used in place, without a copy, and a read's buffer is
 *    written by a library thread: both must stay valid, and a write's unchanged, until the
 *    request completed.
 *  - A completion serves one request. Release it only once that request completed.
 *  - Callbacks run on a library reactor thread: they must be short and must not block
 *    (no synchronous carmine call, no carmine_aio_wait_for_complete in a callback). The
 *    result is available in the callback; the request counts as complete (a waiter returns)
 *    once the callback returned, as with librbd. A callback may release its completion.
 *  - Completions created without a callback are queued on their image when done: wait for
 *    carmine_image_event_fd() to be readable (poll/epoll), then carmine_poll_io_events().
 *    The fd stays readable while completed requests remain unpolled. (Inline mode: call
 *    carmine_run() instead of waiting on the fd.)
 *  - A writable open takes the image's exclusive lock (renewed in the background every third
 *    of "lock_lease_ms"); another client's writer gets -EBUSY. Further writable opens through
 *    the same cluster handle share the image and its lock, which is released with the last
 *    of them (each has its own completion queue). carmine_open_read_only takes no lock.
 *
 * Durability: a write completes once every copy the pool keeps has it durably; flush has
 * nothing left to wait for and completes at once (it is there for callers that need one).
 */
#ifndef CARMINE_H
#define CARMINE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CARMINE_VERSION_MAJOR 0
#define CARMINE_VERSION_MINOR 1
#define CARMINE_VERSION_EXTRA 0

typedef struct carmine_cluster carmine_cluster_t;
typedef struct carmine_image carmine_image_t;
typedef void *carmine_completion_t;
typedef void (*carmine_callback_t)(carmine_completion_t c, void *arg);

typedef struct {
    uint64_t size;        /* bytes */
    uint64_t object_size; /* bytes per object the image is striped over */
    uint64_t num_objs;
    uint32_t read_only;   /* opened with carmine_open_read_only */
    uint32_t reserved;
} carmine_image_info_t;

void carmine_version(int *major, int *minor, int *extra);
/* A fixed description of an errno (negative or not). Never NULL. */
const char *carmine_strerror(int err);
/* Why the last failing call on this thread failed; valid until its next failing call. */
const char *carmine_last_error(void);

/* Cluster handles. */
int carmine_create(carmine_cluster_t **cluster);
/*
 * Options, before carmine_connect:
 *   cluster_dir       a cluster directory (carmine cluster up --dir): map source and key
 *   osds              or OSD endpoints to fetch the map from: "127.0.0.1:6800,..."
 *   key_file          the cluster key, with osds (a cluster_dir brings its own)
 *   pool              the pool holding the images [rbd]
 *   reactors          library reactor threads; images are spread over them; 0: inline [1]
 *   reactor_cpus      CPUs to pin them to, one per reactor: "2,3" [unpinned]
 *   queue_depth       requests queued to a reactor before callers wait [4096]
 *   retry_timeout_ms  how long a request waits for an unreachable OSD before -ENOTCONN [30000]
 *   lock_lease_ms     lease of the exclusive lock a writable open takes [10000]
 * Unknown keys and bad values: -EINVAL.
 */
int carmine_conf_set(carmine_cluster_t *cluster, const char *key, const char *value);
/* Starts the reactors and connects them: -ENOTCONN if no OSD answers, -ENOENT if the pool
 * does not exist, -EACCES on a wrong key. */
int carmine_connect(carmine_cluster_t *cluster);
/* Closes images still open, stops the reactors and frees the handle. */
void carmine_shutdown(carmine_cluster_t *cluster);
/* Inline mode: runs the client on this thread for up to timeout_ms (-1: until some I/O
 * completes, 0: only what is ready), then returns 0. With reactor threads it returns 0 at
 * once. Completed requests are then in their images' queues (carmine_poll_io_events) or
 * have had their callbacks. */
int carmine_run(carmine_cluster_t *cluster, int timeout_ms);

/* Images. object_size 0: the default (4 MiB). */
int carmine_create_image(carmine_cluster_t *cluster, const char *name, uint64_t size,
                         uint64_t object_size);
int carmine_remove_image(carmine_cluster_t *cluster, const char *name);
int carmine_open(carmine_cluster_t *cluster, const char *name, carmine_image_t **image);
int carmine_open_read_only(carmine_cluster_t *cluster, const char *name,
                           carmine_image_t **image);
/* Waits for the image's requests in flight, releases its lock and frees the handle. */
int carmine_close(carmine_image_t *image);
int carmine_get_size(carmine_image_t *image, uint64_t *size);
int carmine_stat(carmine_image_t *image, carmine_image_info_t *info, size_t infosize);

/* Synchronous I/O: bytes read or written, 0, or a negative errno. Out of range: -EINVAL;
 * a read-only image: -EROFS; a lost lock: -ESHUTDOWN. */
ssize_t carmine_read(carmine_image_t *image, uint64_t off, size_t len, char *buf);
ssize_t carmine_write(carmine_image_t *image, uint64_t off, size_t len, const char *buf);
int carmine_discard(carmine_image_t *image, uint64_t off, uint64_t len);
int carmine_write_zeroes(carmine_image_t *image, uint64_t off, uint64_t len);
int carmine_flush(carmine_image_t *image);

/* Asynchronous I/O. The submitting call returns 0 once queued (the completion then fires
 * exactly once) or a negative errno (nothing queued; the completion will not fire). */
int carmine_aio_create_completion(void *arg, carmine_callback_t cb, carmine_completion_t *c);
int carmine_aio_read(carmine_image_t *image, uint64_t off, size_t len, char *buf,
                     carmine_completion_t c);
int carmine_aio_write(carmine_image_t *image, uint64_t off, size_t len, const char *buf,
                      carmine_completion_t c);
int carmine_aio_discard(carmine_image_t *image, uint64_t off, uint64_t len,
                        carmine_completion_t c);
int carmine_aio_write_zeroes(carmine_image_t *image, uint64_t off, uint64_t len,
                             carmine_completion_t c);
int carmine_aio_flush(carmine_image_t *image, carmine_completion_t c);
int carmine_aio_wait_for_complete(carmine_completion_t c);
int carmine_aio_is_complete(carmine_completion_t c);
/* Bytes read or written, 0, or a negative errno. */
ssize_t carmine_aio_get_return_value(carmine_completion_t c);
void *carmine_aio_get_arg(carmine_completion_t c);
void carmine_aio_release(carmine_completion_t c);

/* Polling completions created without a callback (see above). */
int carmine_image_event_fd(carmine_image_t *image);
/* Up to numcomp completed requests of the image; returns how many. */
int carmine_poll_io_events(carmine_image_t *image, carmine_completion_t *comps, int numcomp);

#ifdef __cplusplus
}
#endif

#endif /* CARMINE_H */
