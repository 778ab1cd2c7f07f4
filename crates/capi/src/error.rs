//! Errors as the C API returns them: a negative errno, and for the call that failed on this
//! thread a message saying why (`carmine_last_error`).

use carmine_client::ClientError;
use carmine_proto::Status;
use carmine_volume::VolumeError;
use std::cell::RefCell;
use std::ffi::CString;

#[derive(Debug)]
pub struct Failure {
    pub errno: i32,
    pub message: String,
}

impl Failure {
    pub fn new(errno: i32, message: impl Into<String>) -> Self {
        Failure {
            errno,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Failure::new(libc::EINVAL, message)
    }

    pub fn shut_down() -> Self {
        Failure::new(libc::ESHUTDOWN, "the cluster handle was shut down")
    }
}

impl From<VolumeError> for Failure {
    fn from(e: VolumeError) -> Self {
        Failure::new(errno_of_volume(&e), e.to_string())
    }
}

pub fn errno_of_volume(e: &VolumeError) -> i32 {
    match e {
        VolumeError::NotFound { .. } => libc::ENOENT,
        VolumeError::Exists { .. } => libc::EEXIST,
        VolumeError::InvalidName { .. }
        | VolumeError::OutOfRange { .. }
        | VolumeError::InvalidArgument(_) => libc::EINVAL,
        VolumeError::Locked { .. } => libc::EBUSY,
        // As librbd reports a client whose lock was broken (blocklisted).
        VolumeError::LockLost { .. } => libc::ESHUTDOWN,
        VolumeError::ReadOnly { .. } => libc::EROFS,
        // Being copied (busy), or a copy cut short (remove it and copy again).
        VolumeError::Incomplete { .. } => libc::EBUSY,
        VolumeError::Client(c) => errno_of_client(c),
        _ => libc::EIO,
    }
}

pub fn errno_of_client(e: &ClientError) -> i32 {
    match e {
        ClientError::Server(r) => match r.status {
            Status::NoSpace => libc::ENOSPC,
            Status::ObjectNotFound | Status::PoolNotFound => libc::ENOENT,
            Status::InvalidArgument => libc::EINVAL,
            Status::Fenced => libc::ESHUTDOWN,
            Status::AuthFailed => libc::EACCES,
            _ => libc::EIO,
        },
        ClientError::Auth { .. } => libc::EACCES,
        ClientError::Protocol { .. } => libc::EPROTO,
        ClientError::TimedOut { .. } => libc::ETIMEDOUT,
        ClientError::Connect { .. }
        | ClientError::Unavailable { .. }
        | ClientError::NoAddress
        | ClientError::NoOsd { .. } => libc::ENOTCONN,
        _ => libc::EIO,
    }
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `f` as this thread's last error and returns its negative errno.
pub fn record(f: Failure) -> i32 {
    let msg = CString::new(f.message.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = msg);
    -f.errno
}

/// This thread's last error message; valid until its next failing call.
pub fn last() -> *const libc::c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// A fixed description of `err` (negative or positive errno), as `strerror` would give it,
/// without its thread-safety problems.
pub fn describe(err: i32) -> &'static std::ffi::CStr {
    match err.unsigned_abs() as i32 {
        0 => c"success",
        libc::ENOENT => c"no such image or pool",
        libc::EEXIST => c"already exists",
        libc::EINVAL => c"invalid argument",
        libc::EBUSY => c"image is locked by another client",
        libc::ESHUTDOWN => c"handle shut down, or its image lock was lost",
        libc::EROFS => c"image opened read-only",
        libc::ENOSPC => c"no space left in the cluster",
        libc::EACCES => c"authentication failed",
        libc::EPROTO => c"protocol error",
        libc::ETIMEDOUT => c"timed out",
        libc::ENOTCONN => c"cluster unreachable",
        libc::EBADF => c"image not open",
        libc::EIO => c"I/O error",
        libc::ENOMEM => c"out of memory",
        libc::EAGAIN => c"resource temporarily unavailable",
        _ => c"unknown error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carmine_proto::ErrorReply;

    fn server(status: Status) -> VolumeError {
        VolumeError::Client(ClientError::Server(ErrorReply {
            status,
            op_index: None,
            message: String::new(),
        }))
    }

    #[test]
    fn storage_errors_reach_c_as_their_errno() {
        assert_eq!(errno_of_volume(&server(Status::NoSpace)), libc::ENOSPC);
        assert_eq!(errno_of_volume(&server(Status::Fenced)), libc::ESHUTDOWN);
        assert_eq!(errno_of_volume(&server(Status::Corrupt)), libc::EIO);
        let locked = VolumeError::Locked {
            name: "v".into(),
            holder: "h".into(),
        };
        assert_eq!(errno_of_volume(&locked), libc::EBUSY);
        assert_eq!(
            describe(-libc::ENOSPC).to_str().unwrap(),
            "no space left in the cluster"
        );
        assert_eq!(describe(12345).to_str().unwrap(), "unknown error");
    }

    #[test]
    fn the_last_error_is_per_thread() {
        assert_eq!(record(Failure::new(libc::EIO, "here")), -libc::EIO);
        let elsewhere = std::thread::spawn(|| {
            // SAFETY: a NUL-terminated string owned by this thread.
            unsafe { std::ffi::CStr::from_ptr(last()) }
                .to_str()
                .unwrap()
                .to_owned()
        })
        .join()
        .unwrap();
        assert_eq!(elsewhere, "");
        // SAFETY: as above.
        assert_eq!(
            unsafe { std::ffi::CStr::from_ptr(last()) }
                .to_str()
                .unwrap(),
            "here"
        );
    }
}
