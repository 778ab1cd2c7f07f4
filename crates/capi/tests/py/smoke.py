"""libcarmine from Python through ctypes: the C API without a compiler.

Usage: smoke.py LIBCARMINE_SO OSD_ADDR. Exits non-zero (an assertion) on any failure.
"""
import ctypes
import errno
import os
import select
import sys

lib = ctypes.CDLL(sys.argv[1])
addr = sys.argv[2].encode()

c_void_pp = ctypes.POINTER(ctypes.c_void_p)
lib.carmine_create.argtypes = [c_void_pp]
lib.carmine_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
lib.carmine_connect.argtypes = [ctypes.c_void_p]
lib.carmine_shutdown.argtypes = [ctypes.c_void_p]
lib.carmine_shutdown.restype = None
lib.carmine_create_image.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64]
lib.carmine_remove_image.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
lib.carmine_open.argtypes = [ctypes.c_void_p, ctypes.c_char_p, c_void_pp]
lib.carmine_close.argtypes = [ctypes.c_void_p]
lib.carmine_get_size.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
lib.carmine_write.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_char_p]
lib.carmine_write.restype = ctypes.c_ssize_t
lib.carmine_read.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_char_p]
lib.carmine_read.restype = ctypes.c_ssize_t
lib.carmine_strerror.restype = ctypes.c_char_p
lib.carmine_last_error.restype = ctypes.c_char_p
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
lib.carmine_aio_create_completion.argtypes = [ctypes.c_void_p, CALLBACK, c_void_pp]
lib.carmine_aio_write.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
lib.carmine_aio_read.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
lib.carmine_aio_wait_for_complete.argtypes = [ctypes.c_void_p]
lib.carmine_aio_get_return_value.argtypes = [ctypes.c_void_p]
lib.carmine_aio_get_return_value.restype = ctypes.c_ssize_t
lib.carmine_aio_release.argtypes = [ctypes.c_void_p]
lib.carmine_aio_release.restype = None
lib.carmine_image_event_fd.argtypes = [ctypes.c_void_p]
lib.carmine_poll_io_events.argtypes = [ctypes.c_void_p, c_void_pp, ctypes.c_int]


def ok(r, what):
    assert r >= 0, f"{what}: {r} {lib.carmine_strerror(r).decode()} ({lib.carmine_last_error().decode()})"
    return r


cl = ctypes.c_void_p()
ok(lib.carmine_create(ctypes.byref(cl)), "create")
assert lib.carmine_conf_set(cl, b"nonsense", b"1") == -errno.EINVAL
assert b"nonsense" in lib.carmine_last_error()
ok(lib.carmine_conf_set(cl, b"osds", addr), "osds")
ok(lib.carmine_connect(cl), "connect")
ok(lib.carmine_create_image(cl, b"py", 8 << 20, 0), "create image")
img = ctypes.c_void_p()
assert lib.carmine_open(cl, b"nope", ctypes.byref(img)) == -errno.ENOENT
ok(lib.carmine_open(cl, b"py", ctypes.byref(img)), "open")
size = ctypes.c_uint64()
ok(lib.carmine_get_size(img, ctypes.byref(size)), "size")
assert size.value == 8 << 20

data = bytes(range(256)) * 16
assert ok(lib.carmine_write(img, 4096, len(data), data), "write") == 4096
back = ctypes.create_string_buffer(4096)
assert ok(lib.carmine_read(img, 4096, 4096, back), "read") == 4096
assert back.raw == data
assert lib.carmine_read(img, 8 << 20, 4096, back) == -errno.EINVAL

# A write with a callback, waited for.
called = []
on_done = CALLBACK(lambda c, arg: called.append(arg))
c = ctypes.c_void_p()
ok(lib.carmine_aio_create_completion(ctypes.c_void_p(7), on_done, ctypes.byref(c)), "completion")
payload = b"\xab" * 4096
ok(lib.carmine_aio_write(img, 0, 4096, payload, c), "aio write")
ok(lib.carmine_aio_wait_for_complete(c), "wait")
assert lib.carmine_aio_get_return_value(c) == 4096
lib.carmine_aio_release(c)
assert called == [7], called

# A read without a callback, reaped through the eventfd.
fd = ok(lib.carmine_image_event_fd(img), "event fd")
c = ctypes.c_void_p()
ok(lib.carmine_aio_create_completion(None, CALLBACK(), ctypes.byref(c)), "completion")
ok(lib.carmine_aio_read(img, 0, 4096, back, c), "aio read")
ready, _, _ = select.select([fd], [], [], 10)
assert ready == [fd], "the eventfd became readable"
got = (ctypes.c_void_p * 4)()
n = lib.carmine_poll_io_events(img, got, 4)
assert n == 1, (n, lib.carmine_last_error())
assert got[0] == c.value
assert lib.carmine_aio_get_return_value(c) == 4096 and back.raw == payload
lib.carmine_aio_release(c)

ok(lib.carmine_close(img), "close")
ok(lib.carmine_remove_image(cl, b"py"), "remove")
lib.carmine_shutdown(cl)
print("python smoke test passed")
