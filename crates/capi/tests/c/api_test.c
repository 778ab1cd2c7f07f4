/* The C API as a C program uses it: run by tests/c_api.rs against a live OSD.
 * Usage: api_test OSD_ADDR REACTORS (0: inline). Exits 0 when every check passed; prints the first failure. */
#define _GNU_SOURCE
#include "carmine.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024 * 1024)
#define IMAGE_SIZE (64 * MIB)
#define OBJECT_SIZE (1 * MIB)

static int checks;

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        checks++;                                                                         \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "FAILED at line %d: %s: ", __LINE__, #cond);                  \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fprintf(stderr, " (last error: %s)\n", carmine_last_error());                 \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static void fill(char *buf, size_t len, uint64_t seed) {
    for (size_t i = 0; i < len; i++)
        buf[i] = (char)((seed * 2654435761u + i * 31) >> 3);
}

static const char *reactors = "1";

static carmine_cluster_t *connect_to(const char *osds) {
    carmine_cluster_t *cl = NULL;
    CHECK(carmine_create(&cl) == 0 && cl, "create");
    CHECK(carmine_conf_set(cl, "osds", osds) == 0, "osds");
    CHECK(carmine_conf_set(cl, "reactors", reactors) == 0, "reactors");
    CHECK(carmine_conf_set(cl, "lock_lease_ms", "2000") == 0, "lease");
    int r = carmine_connect(cl);
    CHECK(r == 0, "connect: %d", r);
    return cl;
}

static void test_errors(const char *osds) {
    carmine_cluster_t *cl = NULL;
    CHECK(carmine_create(&cl) == 0, "create");
    int r = carmine_conf_set(cl, "colour", "red");
    CHECK(r == -EINVAL, "unknown key: %d", r);
    CHECK(strstr(carmine_last_error(), "colour") != NULL, "message names the key");
    CHECK(carmine_conf_set(cl, "reactors", "-1") == -EINVAL, "negative reactors");
    CHECK(carmine_conf_set(cl, "reactors", "65") == -EINVAL, "too many reactors");
    CHECK(carmine_conf_set(cl, NULL, "x") == -EINVAL, "null key");
    carmine_image_t *img = NULL;
    CHECK(carmine_open(cl, "vol", &img) == -ENOTCONN, "open before connect");
    CHECK(carmine_connect(cl) == -EINVAL, "connect with no cluster named");
    carmine_shutdown(cl);

    /* A dead cluster: nothing listens there. */
    CHECK(carmine_create(&cl) == 0, "create");
    CHECK(carmine_conf_set(cl, "osds", "127.0.0.1:1") == 0, "osds");
    CHECK(carmine_conf_set(cl, "retry_timeout_ms", "200") == 0, "retry");
    r = carmine_connect(cl);
    CHECK(r == -ENOTCONN, "connect to a dead cluster: %d (%s)", r, carmine_strerror(r));
    carmine_shutdown(cl);

    /* A pool that does not exist. */
    CHECK(carmine_create(&cl) == 0, "create");
    CHECK(carmine_conf_set(cl, "osds", osds) == 0, "osds");
    CHECK(carmine_conf_set(cl, "pool", "nope") == 0, "pool");
    r = carmine_connect(cl);
    CHECK(r == -ENOENT, "unknown pool: %d", r);
    carmine_shutdown(cl);

    CHECK(strcmp(carmine_strerror(-EBUSY), carmine_strerror(EBUSY)) == 0, "strerror sign");
    CHECK(carmine_strerror(-12345) != NULL, "strerror of anything");
    CHECK(carmine_read(NULL, 0, 1, NULL) == -EINVAL, "null image");
    carmine_shutdown(NULL);
    carmine_aio_release(NULL);
}

static void test_sync(carmine_cluster_t *cl, const char *osds) {
    carmine_image_t *img = NULL;
    int r = carmine_open(cl, "nope", &img);
    CHECK(r == -ENOENT, "open unknown image: %d", r);
    CHECK(carmine_open(cl, "vol", &img) == 0, "open");

    uint64_t size = 0;
    CHECK(carmine_get_size(img, &size) == 0 && size == IMAGE_SIZE, "size %llu",
          (unsigned long long)size);
    carmine_image_info_t info;
    CHECK(carmine_stat(img, &info, sizeof info) == 0, "stat");
    CHECK(info.object_size == OBJECT_SIZE && info.num_objs == 64 && !info.read_only,
          "info %llu %llu", (unsigned long long)info.object_size,
          (unsigned long long)info.num_objs);
    CHECK(carmine_stat(img, &info, 4) == -EINVAL, "stat with a short struct");

    /* A write across an object boundary, read back. */
    size_t len = 3 * 4096;
    uint64_t off = OBJECT_SIZE - 4096;
    char *w = malloc(len), *rd = malloc(len);
    fill(w, len, 1);
    CHECK(carmine_write(img, off, len, w) == (ssize_t)len, "write");
    memset(rd, 0, len);
    CHECK(carmine_read(img, off, len, rd) == (ssize_t)len, "read");
    CHECK(memcmp(w, rd, len) == 0, "read what was written");

    /* Out of range, and zero length. */
    CHECK(carmine_write(img, IMAGE_SIZE - 4096, 8192, w) == -EINVAL, "write past the end");
    CHECK(carmine_read(img, UINT64_MAX - 10, 4096, rd) == -EINVAL, "offset overflow");
    CHECK(carmine_read(img, 0, 0, rd) == 0, "zero-length read");
    CHECK(carmine_read(img, 0, 4096, NULL) == -EINVAL, "null buffer");

    /* Discard and write-zeroes read back as zeros. */
    CHECK(carmine_discard(img, off, 4096) == 0, "discard");
    CHECK(carmine_write_zeroes(img, off + 4096, 4096) == 0, "write zeroes");
    CHECK(carmine_read(img, off, len, rd) == (ssize_t)len, "read");
    for (size_t i = 0; i < 8192; i++)
        CHECK(rd[i] == 0, "byte %zu is zero", i);
    CHECK(memcmp(rd + 8192, w + 8192, 4096) == 0, "the rest is untouched");
    CHECK(carmine_flush(img) == 0, "flush");

    /* Another client's writer is refused while we hold the lock; a reader is not. A second
     * writable open through this handle shares the image and its lock, which goes only with
     * the last close. */
    carmine_image_t *other = NULL;
    carmine_cluster_t *cl2 = connect_to(osds);
    r = carmine_open(cl2, "vol", &other);
    CHECK(r == -EBUSY, "writable open by another client: %d", r);
    CHECK(strstr(carmine_last_error(), "libcarmine") != NULL, "says who holds it: %s",
          carmine_last_error());
    carmine_image_t *twin = NULL;
    CHECK(carmine_open(cl, "vol", &twin) == 0, "second writable open through one handle");
    CHECK(carmine_write(twin, off + 8192, 4096, w + 8192) == 4096, "write through the twin");
    CHECK(carmine_close(twin) == 0, "close the twin");
    CHECK(carmine_open(cl2, "vol", &other) == -EBUSY, "the first handle still holds the lock");
    CHECK(carmine_write(img, off + 8192, 4096, w + 8192) == 4096, "the first still writes");
    carmine_shutdown(cl2);
    CHECK(carmine_open_read_only(cl, "vol", &other) == 0, "read-only open");
    CHECK(carmine_write(other, 0, 4096, w) == -EROFS, "write to a read-only image");
    CHECK(carmine_discard(other, 0, 4096) == -EROFS, "discard on a read-only image");
    CHECK(carmine_read(other, off + 8192, 4096, rd) == 4096, "read-only read");
    CHECK(memcmp(rd, w + 8192, 4096) == 0, "read-only sees the data");
    CHECK(carmine_close(other) == 0, "close read-only");
    CHECK(carmine_close(img) == 0, "close");
    free(w);
    free(rd);
}

#define INFLIGHT 128

static atomic_int callbacks;
static void on_done(carmine_completion_t c, void *arg) {
    (void)arg;
    /* The result is there; the request counts as complete once the callback returned. */
    if (carmine_aio_get_return_value(c) == 4096 && !carmine_aio_is_complete(c))
        atomic_fetch_add(&callbacks, 1);
}

static void test_aio(carmine_cluster_t *cl) {
    carmine_image_t *img = NULL;
    CHECK(carmine_open(cl, "vol", &img) == 0, "open");
    char *bufs = malloc((size_t)INFLIGHT * 4096);
    carmine_completion_t cs[INFLIGHT];
    /* Synchronous requests are waited for by their caller: never queued for polling (checked
     * below, once the polled ones are reaped). */
    CHECK(carmine_write(img, 0, 4096, bufs) == 4096, "sync write");
    CHECK(carmine_read(img, 0, 4096, bufs) == 4096, "sync read");

    /* Callbacks: INFLIGHT writes at once. */
    for (int i = 0; i < INFLIGHT; i++) {
        fill(bufs + i * 4096, 4096, 100 + i);
        CHECK(carmine_aio_create_completion((void *)(intptr_t)i, on_done, &cs[i]) == 0, "cc");
        CHECK(carmine_aio_write(img, (uint64_t)i * 65536, 4096, bufs + i * 4096, cs[i]) == 0,
              "aio write %d", i);
    }
    for (int i = 0; i < INFLIGHT; i++) {
        CHECK(carmine_aio_wait_for_complete(cs[i]) == 0, "wait");
        CHECK(carmine_aio_get_return_value(cs[i]) == 4096, "write %d returned %zd", i,
              carmine_aio_get_return_value(cs[i]));
        CHECK(carmine_aio_get_arg(cs[i]) == (void *)(intptr_t)i, "arg");
        /* A completion serves one request. */
        if (i == 0)
            CHECK(carmine_aio_flush(img, cs[0]) == -EINVAL, "completion reused");
        carmine_aio_release(cs[i]);
    }
    CHECK(atomic_load(&callbacks) == INFLIGHT, "every callback ran once: %d",
          atomic_load(&callbacks));

    /* Polling: reads without callbacks, reaped through the eventfd. */
    int fd = carmine_image_event_fd(img);
    CHECK(fd >= 0, "event fd");
    char *rd = calloc(INFLIGHT, 4096);
    for (int i = 0; i < INFLIGHT; i++) {
        CHECK(carmine_aio_create_completion((void *)(intptr_t)i, NULL, &cs[i]) == 0, "cc");
        CHECK(carmine_aio_read(img, (uint64_t)i * 65536, 4096, rd + i * 4096, cs[i]) == 0,
              "aio read");
    }
    int reaped = 0, wakeups = 0;
    while (reaped < INFLIGHT) {
        if (strcmp(reactors, "0") == 0) {
            /* Inline: the client runs only inside the library. */
            CHECK(carmine_run(cl, 10000) == 0, "run");
        } else {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            CHECK(poll(&p, 1, 10000) == 1, "event fd readable within 10 s (%d reaped)", reaped);
        }
        wakeups++;
        carmine_completion_t got[16];
        int n = carmine_poll_io_events(img, got, 16);
        CHECK(n >= 0 && n <= 16, "poll returned %d", n);
        for (int k = 0; k < n; k++) {
            int i = (int)(intptr_t)carmine_aio_get_arg(got[k]);
            CHECK(carmine_aio_get_return_value(got[k]) == 4096, "read %d", i);
            CHECK(memcmp(rd + i * 4096, bufs + i * 4096, 4096) == 0, "read %d data", i);
            carmine_aio_release(got[k]);
            reaped++;
        }
    }
    CHECK(reaped == INFLIGHT, "reaped %d", reaped);
    carmine_completion_t none[1];
    CHECK(carmine_poll_io_events(img, none, 1) == 0, "nothing more (no synchronous request)");
    printf("polled %d completions in %d wakeups\n", reaped, wakeups);

    /* An error comes back through the completion; a bad request is refused at submission. */
    carmine_completion_t c;
    CHECK(carmine_aio_create_completion(NULL, NULL, &c) == 0, "cc");
    CHECK(carmine_aio_read(img, IMAGE_SIZE, 4096, rd, c) == -EINVAL, "aio out of range");
    CHECK(carmine_aio_flush(img, c) == 0, "aio flush");
    CHECK(carmine_aio_wait_for_complete(c) == 0 && carmine_aio_get_return_value(c) == 0, "flush");
    carmine_aio_release(c);
    CHECK(carmine_close(img) == 0, "close");
    free(bufs);
    free(rd);
}

/* Threads writing and verifying their own regions of one image, all at once. */
#define THREADS 4
#define ROUNDS 300
struct worker {
    carmine_image_t *img;
    int id;
    int failed;
};

static void *work(void *p) {
    struct worker *w = p;
    char buf[8192], rd[8192];
    uint64_t base = (uint64_t)(w->id + 1) * 8 * MIB;
    unsigned seed = (unsigned)w->id * 7919 + 1;
    for (int i = 0; i < ROUNDS; i++) {
        uint64_t off = base + (uint64_t)(rand_r(&seed) % 512) * 4096;
        fill(buf, sizeof buf, (uint64_t)w->id * 100000 + i);
        if (carmine_write(w->img, off, sizeof buf, buf) != (ssize_t)sizeof buf ||
            carmine_read(w->img, off, sizeof rd, rd) != (ssize_t)sizeof rd ||
            memcmp(buf, rd, sizeof buf) != 0) {
            w->failed = i + 1;
            return NULL;
        }
    }
    return NULL;
}

static void *use_elsewhere(void *p) {
    char buf[4096];
    return (void *)(intptr_t)carmine_read(p, 0, sizeof buf, buf);
}

static void test_threads(carmine_cluster_t *cl) {
    carmine_image_t *img = NULL;
    CHECK(carmine_open(cl, "vol", &img) == 0, "open");
    if (strcmp(reactors, "0") == 0) {
        /* An inline handle serves only its own thread. */
        pthread_t t;
        void *r;
        CHECK(pthread_create(&t, NULL, use_elsewhere, img) == 0, "thread");
        pthread_join(t, &r);
        CHECK((intptr_t)r == -EINVAL, "inline handle used from another thread: %d",
              (int)(intptr_t)r);
        CHECK(carmine_close(img) == 0, "close");
        return;
    }
    pthread_t t[THREADS];
    struct worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker){.img = img, .id = i, .failed = 0};
        CHECK(pthread_create(&t[i], NULL, work, &w[i]) == 0, "thread");
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK(w[i].failed == 0, "thread %d failed in round %d", i, w[i].failed);
    }
    /* Left open: the shutdown closes it and releases its lock. */
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s OSD_ADDR REACTORS (0: inline)\n", argv[0]);
        return 2;
    }
    reactors = argv[2];
    int major, minor, extra;
    carmine_version(&major, &minor, &extra);
    CHECK(major == CARMINE_VERSION_MAJOR && minor == CARMINE_VERSION_MINOR, "version");

    test_errors(argv[1]);
    carmine_cluster_t *cl = connect_to(argv[1]);
    int r = carmine_create_image(cl, "vol", IMAGE_SIZE, OBJECT_SIZE);
    CHECK(r == 0, "create image: %d", r);
    CHECK(carmine_create_image(cl, "vol", IMAGE_SIZE, 0) == -EEXIST, "create twice");
    test_sync(cl, argv[1]);
    test_aio(cl);
    test_threads(cl);
    carmine_shutdown(cl);

    /* The shutdown released the lock: a new client opens the image for writing at once. */
    cl = connect_to(argv[1]);
    carmine_image_t *img = NULL;
    r = carmine_open(cl, "vol", &img);
    CHECK(r == 0, "open after the shutdown released the lock: %d", r);
    CHECK(carmine_close(img) == 0, "close");
    CHECK(carmine_remove_image(cl, "vol") == 0, "remove");
    CHECK(carmine_open(cl, "vol", &img) == -ENOENT, "gone");
    carmine_shutdown(cl);
    printf("all %d checks passed\n", checks);
    return 0;
}
