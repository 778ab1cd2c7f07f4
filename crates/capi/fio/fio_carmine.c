/*
 * fio-carmine: a fio ioengine on libcarmine, the way fio's rbd engine runs on librbd: the
 * client inside fio, no gateway hop.
 *
 *   fio --ioengine=external:/path/libfio_carmine.so --volume=vol1 --cluster_dir=/path/c1 ...
 *
 * Built by build.sh against the headers of the exact fio version installed (fio keeps no
 * stable engine ABI); the engine also refuses to run in any other fio version.
 *
 * Requests are submitted as libcarmine asynchronous requests without callbacks; getevents
 * reaps them from the image's completion queue, sleeping on its eventfd when it must wait.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fio.h"
#include "optgroup.h"

#include "carmine.h"

#ifndef CARMINE_FIO_BUILT_FOR
#error "build with -DCARMINE_FIO_BUILT_FOR=\"fio-X.Y\" (build.sh does)"
#endif

struct carmine_options {
    void *pad; /* fio: an option must not sit at offset 0 */
    char *cluster_dir;
    char *osds;
    char *key_file;
    char *pool;
    char *volume;
    unsigned int reactors;
    char *reactor_cpus;
    unsigned int busy_poll;
};

static struct fio_option options[] = {
    {
        .name = "cluster_dir",
        .alias = "cluster-dir",
        .lname = "Carmine cluster directory",
        .type = FIO_OPT_STR_STORE,
        .off1 = offsetof(struct carmine_options, cluster_dir),
        .help = "Cluster directory (carmine cluster up --dir): its map and key",
        .category = FIO_OPT_C_ENGINE,
        .group = FIO_OPT_G_INVALID,
    },
    {
        .name = "osds",
        .lname = "Carmine OSD endpoints",
        .type = FIO_OPT_STR_STORE,
        .off1 = offsetof(struct carmine_options, osds),
        .help = "Or OSD endpoints to fetch the map from (127.0.0.1:6800,...)",
        .category = FIO_OPT_C_ENGINE,
        .group = FIO_OPT_G_INVALID,
    },
    {
        .name = "key_file",
        .alias = "key-file",
        .lname = "Carmine key file",
        .type = FIO_OPT_STR_STORE,
        .off1 = offsetof(struct carmine_options, key_file),
        .help = "The cluster key, with osds",
        .category = FIO_OPT_C_ENGINE,
        .group = FIO_OPT_G_INVALID,
    },
    {
        .name = "pool",
        .lname = "Carmine pool",
        .type = FIO_OPT_STR_STORE,
        .off1 = offsetof(struct carmine_options, pool),
        .help = "Pool holding the volume",
        .def = "rbd",
        .category = FIO_OPT_C_ENGINE,
        .group = FIO_OPT_G_INVALID,
    },
    {
        .name = "volume",
        .lname = "Carmine volume",
        .type = FIO_OPT_STR_STORE,
        .off1 = offsetof(struct carmine_options, volume),
        .help = "Volume to run on (writers take its exclusive lock: one writing job per volume)",
        .category = FIO_OPT_C_ENGINE,
        .group = FIO_OPT_G_INVALID,
    },
    {
        .name = "reactors",
        .lname = "libcarmine reactor threads",
        .type = FIO_OPT_INT,
        .off1 = offsetof(struct carmine_options, reactors),
        .help = "libcarmine reactor threads per job (0: the client runs in the job's thread)",
        .def = "0",
        .minval = 0,
        .maxval = 64,
        .category = FIO_OPT_C_ENGINE,
        .group = FIO_OPT_G_INVALID,
    },
    {
        .name = "reactor_cpus",
        .alias = "reactor-cpus",
        .lname = "libcarmine reactor CPUs",
        .type = FIO_OPT_STR_STORE,
        .off1 = offsetof(struct carmine_options, reactor_cpus),
        .help = "CPUs to pin the reactors to, one per reactor (2,3)",
        .category = FIO_OPT_C_ENGINE,
        .group = FIO_OPT_G_INVALID,
    },
    {
        .name = "busy_poll",
        .lname = "Busy poll for completions",
        .type = FIO_OPT_BOOL,
        .off1 = offsetof(struct carmine_options, busy_poll),
        .help = "Spin on the completion queue instead of sleeping on its eventfd",
        .def = "0",
        .category = FIO_OPT_C_ENGINE,
        .group = FIO_OPT_G_INVALID,
    },
    {
        .name = NULL,
    },
};

struct carmine_data {
    carmine_cluster_t *cluster;
    carmine_image_t *image;
    int event_fd;
    int inline_client;
    int shared; /* d->cluster is the process's shared one (see shared_cluster) */
    struct io_u **events;
    carmine_completion_t *reaped;
    unsigned int depth;
};

static int fail(struct thread_data *td, const char *what, int r) {
    log_err("fio-carmine: %s: %s (%s)\n", what, carmine_strerror(r), carmine_last_error());
    td_verror(td, -r, what);
    return 1;
}

static int set(struct thread_data *td, carmine_cluster_t *cl, const char *key, const char *value) {
    int r;
    if (!value || !*value)
        return 0;
    r = carmine_conf_set(cl, key, value);
    return r < 0 ? fail(td, key, r) : 0;
}

/*
 * Writing jobs of one job group (numjobs > 1) share one cluster handle with reactor threads:
 * each writer holds its volume's exclusive lock, and image handles opened through one cluster
 * handle share it. Each job still opens its own image handle, so completions go to the job
 * that submitted them.
 */
static struct {
    pthread_mutex_t lock;
    char key[4096];
    carmine_cluster_t *cluster;
    int users;
} shared = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void put_shared(void) {
    pthread_mutex_lock(&shared.lock);
    if (--shared.users == 0) {
        carmine_shutdown(shared.cluster);
        shared.cluster = NULL;
    }
    pthread_mutex_unlock(&shared.lock);
}

static void carmine_cleanup(struct thread_data *td) {
    struct carmine_data *d = td->io_ops_data;
    if (!d)
        return;
    if (d->image)
        carmine_close(d->image);
    if (d->cluster && d->shared)
        put_shared();
    else if (d->cluster)
        carmine_shutdown(d->cluster);
    free(d->events);
    free(d->reaped);
    free(d);
    td->io_ops_data = NULL;
}

/* A cluster handle configured from the job's options, connected. */
static carmine_cluster_t *connect_cluster(struct thread_data *td, unsigned int reactors) {
    struct carmine_options *o = td->eo;
    carmine_cluster_t *cl = NULL;
    char number[16];
    int r = carmine_create(&cl);
    if (r < 0) {
        fail(td, "create", r);
        return NULL;
    }
    snprintf(number, sizeof(number), "%u", reactors);
    if (set(td, cl, "cluster_dir", o->cluster_dir) || set(td, cl, "osds", o->osds) ||
        set(td, cl, "key_file", o->key_file) || set(td, cl, "pool", o->pool) ||
        set(td, cl, "reactors", number) ||
        (reactors > 0 && set(td, cl, "reactor_cpus", o->reactor_cpus)))
        goto out;
    r = carmine_connect(cl);
    if (r < 0) {
        fail(td, "connect", r);
        goto out;
    }
    return cl;
out:
    carmine_shutdown(cl);
    return NULL;
}

/* In fio's main thread: checks the build, and tells fio the volume's size as its file's
 * (through a short-lived read-only open: the job's own client starts in its thread, init). */
static int carmine_setup(struct thread_data *td) {
    struct carmine_options *o = td->eo;
    carmine_cluster_t *cl;
    carmine_image_t *img = NULL;
    struct fio_file *f;
    uint64_t size = 0;
    int r;

    if (strcmp(fio_version_string, CARMINE_FIO_BUILT_FOR) != 0) {
        log_err("fio-carmine: built for %s, but this is %s: rebuild it against this fio "
                "(crates/capi/fio/build.sh)\n",
                CARMINE_FIO_BUILT_FOR, fio_version_string);
        return 1;
    }
    if (!o->volume || !*o->volume) {
        log_err("fio-carmine: the volume option is required\n");
        return 1;
    }
    /* The client's threads and ring do not survive a fork. */
    td->o.use_thread = 1;
    cl = connect_cluster(td, 0);
    if (!cl)
        return 1;
    r = carmine_open_read_only(cl, o->volume, &img);
    if (r == 0)
        r = carmine_get_size(img, &size);
    if (r < 0 || size == 0)
        fail(td, "open", r < 0 ? r : -EINVAL);
    if (img)
        carmine_close(img);
    carmine_shutdown(cl);
    if (r < 0 || size == 0)
        return 1;
    if (!td->files_index) {
        add_file(td, td->o.filename ? td->o.filename : o->volume, 0, 0);
        td->o.nr_files = td->o.nr_files ? td->o.nr_files : 1;
        td->o.open_files++;
    }
    f = td->files[0];
    f->real_file_size = size;
    return 0;
}

/* In the job's thread: its own client (inline by default), and the volume opened. */
static int carmine_init(struct thread_data *td) {
    struct carmine_options *o = td->eo;
    struct carmine_data *d;
    int r;

    d = calloc(1, sizeof(*d));
    if (!d)
        return 1;
    td->io_ops_data = d;
    d->depth = td->o.iodepth ? td->o.iodepth : 1;
    d->events = calloc(d->depth, sizeof(*d->events));
    d->reaped = calloc(d->depth, sizeof(*d->reaped));
    if (!d->events || !d->reaped)
        goto out;
    /* fio gives the group's clones numjobs=1 and a subjob number. */
    if ((td->o.numjobs > 1 || td->subjob_number > 0) && (td_write(td) || td_trim(td))) {
        char key[sizeof(shared.key)];
        snprintf(key, sizeof(key), "%s|%s|%s|%s", o->cluster_dir ? o->cluster_dir : "",
                 o->osds ? o->osds : "", o->key_file ? o->key_file : "", o->pool ? o->pool : "");
        pthread_mutex_lock(&shared.lock);
        if (!shared.cluster) {
            /* Used from several job threads: reactor threads, not inline. */
            shared.cluster = connect_cluster(td, o->reactors ? o->reactors : 1);
            snprintf(shared.key, sizeof(shared.key), "%s", key);
        }
        if (shared.cluster && strcmp(shared.key, key) == 0) {
            shared.users++;
            d->cluster = shared.cluster;
            d->shared = 1;
        }
        pthread_mutex_unlock(&shared.lock);
    }
    d->inline_client = !d->shared && o->reactors == 0;
    if (!d->cluster)
        d->cluster = connect_cluster(td, o->reactors);
    if (!d->cluster)
        goto out;
    /* A job that never writes takes no lock, so any number of readers can share a volume. */
    if (td_write(td) || td_trim(td))
        r = carmine_open(d->cluster, o->volume, &d->image);
    else
        r = carmine_open_read_only(d->cluster, o->volume, &d->image);
    if (r < 0) {
        fail(td, "open", r);
        goto out;
    }
    /* An inline client is polled after carmine_run: no eventfd, no syscalls for one. */
    d->event_fd = d->inline_client ? -1 : carmine_image_event_fd(d->image);
    return 0;
out:
    carmine_cleanup(td);
    return 1;
}

static int carmine_open_file(struct thread_data *td, struct fio_file *f) {
    (void)td;
    (void)f;
    return 0;
}

static int carmine_invalidate(struct thread_data *td, struct fio_file *f) {
    (void)td;
    (void)f;
    return 0;
}

static enum fio_q_status carmine_queue(struct thread_data *td, struct io_u *io_u) {
    struct carmine_data *d = td->io_ops_data;
    carmine_completion_t c;
    int r;

    fio_ro_check(td, io_u);
    r = carmine_aio_create_completion(io_u, NULL, &c);
    if (r < 0)
        goto failed;
    switch (io_u->ddir) {
    case DDIR_READ:
        r = carmine_aio_read(d->image, io_u->offset, io_u->xfer_buflen, io_u->xfer_buf, c);
        break;
    case DDIR_WRITE:
        r = carmine_aio_write(d->image, io_u->offset, io_u->xfer_buflen, io_u->xfer_buf, c);
        break;
    case DDIR_TRIM:
        r = carmine_aio_discard(d->image, io_u->offset, io_u->xfer_buflen, c);
        break;
    case DDIR_SYNC:
    case DDIR_DATASYNC:
    case DDIR_SYNC_FILE_RANGE:
        r = carmine_aio_flush(d->image, c);
        break;
    default:
        r = -EINVAL;
        break;
    }
    if (r < 0) {
        carmine_aio_release(c);
        goto failed;
    }
    return FIO_Q_QUEUED;
failed:
    io_u->error = -r;
    td_verror(td, io_u->error, "queue");
    return FIO_Q_COMPLETED;
}

/* Takes what completed (up to max - *events) into d->events. */
static int reap(struct carmine_data *d, unsigned int *events, unsigned int max) {
    int n = carmine_poll_io_events(d->image, d->reaped, (int)(max - *events));
    for (int i = 0; i < n; i++) {
        carmine_completion_t c = d->reaped[i];
        struct io_u *io_u = carmine_aio_get_arg(c);
        ssize_t ret = carmine_aio_get_return_value(c);
        if (ret < 0) {
            io_u->error = (int)-ret;
        } else {
            io_u->error = 0;
            if (io_u->ddir == DDIR_READ || io_u->ddir == DDIR_WRITE)
                io_u->resid = io_u->xfer_buflen - (unsigned long long)ret;
        }
        carmine_aio_release(c);
        d->events[(*events)++] = io_u;
    }
    return n < 0 ? 0 : n;
}

static int carmine_getevents(struct thread_data *td, unsigned int min, unsigned int max,
                             const struct timespec *t) {
    struct carmine_data *d = td->io_ops_data;
    struct carmine_options *o = td->eo;
    unsigned int events = 0;
    int timeout_ms = t ? (int)(t->tv_sec * 1000 + t->tv_nsec / 1000000) : -1;

    if (max > d->depth)
        max = d->depth;
    /* Asked for whatever is done (min 0, as fio does around a sync): an inline client makes
     * progress only in here, so it gets a turn, without waiting. (Always taking this turn
     * made small batches and halved throughput at depth 64: not for min > 0.) */
    if (d->inline_client && min == 0)
        carmine_run(d->cluster, 0);
    for (;;) {
        reap(d, &events, max);
        if (events >= min || events >= max)
            break;
        int r;
        if (d->inline_client) {
            /* The client runs here: let it work (and wait for I/O) until the timeout. */
            r = carmine_run(d->cluster, o->busy_poll ? 0 : timeout_ms);
            if (r < 0)
                break;
            if (timeout_ms >= 0 && !o->busy_poll && reap(d, &events, max) == 0)
                break; /* one wait of the timeout's length found nothing */
            continue;
        }
        if (o->busy_poll)
            continue;
        struct pollfd p = {.fd = d->event_fd, .events = POLLIN};
        r = poll(&p, 1, timeout_ms);
        if (r == 0) {
            reap(d, &events, max);
            break; /* timed out */
        }
        if (r < 0 && errno != EINTR)
            break;
    }
    return (int)events;
}

static struct io_u *carmine_event(struct thread_data *td, int event) {
    struct carmine_data *d = td->io_ops_data;
    return d->events[event];
}

/* fio finds the engine by this symbol (external:PATH). */
struct ioengine_ops ioengine = {
    .name = "carmine",
    .version = FIO_IOOPS_VERSION,
    .flags = FIO_DISKLESSIO | FIO_NOEXTEND,
    .setup = carmine_setup,
    .init = carmine_init,
    .queue = carmine_queue,
    .getevents = carmine_getevents,
    .event = carmine_event,
    .cleanup = carmine_cleanup,
    .open_file = carmine_open_file,
    .invalidate = carmine_invalidate,
    .options = options,
    .option_struct_size = sizeof(struct carmine_options),
};
