//! Named limits shared by several crates. Each limit says why it has its value.

/// Largest object name in bytes. Volume data objects need ~40; RADOS allows 2048.
pub const OBJECT_NAME_LEN_MAX: usize = 1024;

/// Largest xattr name in bytes.
pub const ATTR_NAME_LEN_MAX: usize = 255;

/// Largest single value (xattr, omap value, omap header) in bytes.
pub const VALUE_LEN_MAX: usize = 64 * 1024;

/// Largest byte offset + length inside one object. Objects are sparse; this bound keeps every
/// `offset + length` computation far from u64 overflow.
pub const OBJECT_SIZE_MAX: u64 = 1 << 40;

/// Largest data payload carried by one read or write op. A volume object is 4 MiB by default,
/// so one op can move a whole object; larger requests are split by the client.
pub const IO_LEN_MAX: u32 = 16 * 1024 * 1024;

/// Largest number of sub-operations in one object request.
pub const OPS_PER_REQUEST_MAX: usize = 64;

/// Largest number of entries returned by one omap or object listing.
pub const LIST_LIMIT_MAX: u32 = 4096;
