//! Mapping an image byte range onto data objects.

/// One piece of an image I/O that falls inside a single object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    pub objno: u64,
    /// Offset inside the object.
    pub obj_off: u64,
    pub len: u64,
    /// Offset of this piece inside the caller's buffer.
    pub buf_off: u64,
}

/// Splits `[off, off+len)` at object boundaries.
pub(crate) fn extents(off: u64, len: u64, object_size: u64) -> impl Iterator<Item = Extent> {
    let end = off + len;
    let mut pos = off;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let objno = pos / object_size;
        let obj_off = pos % object_size;
        let piece = (object_size - obj_off).min(end - pos);
        let e = Extent {
            objno,
            obj_off,
            len: piece,
            buf_off: pos - off,
        };
        pos += piece;
        Some(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_inside_one_object_is_one_extent() {
        let v: Vec<_> = extents(4096, 4096, 1 << 22).collect();
        assert_eq!(
            v,
            vec![Extent {
                objno: 0,
                obj_off: 4096,
                len: 4096,
                buf_off: 0
            }]
        );
    }

    #[test]
    fn range_spanning_objects_is_split_at_boundaries() {
        let v: Vec<_> = extents(1000, 10_000, 4096).collect();
        assert_eq!(
            v,
            vec![
                Extent {
                    objno: 0,
                    obj_off: 1000,
                    len: 3096,
                    buf_off: 0
                },
                Extent {
                    objno: 1,
                    obj_off: 0,
                    len: 4096,
                    buf_off: 3096
                },
                Extent {
                    objno: 2,
                    obj_off: 0,
                    len: 2808,
                    buf_off: 7192
                },
            ]
        );
        assert_eq!(v.iter().map(|e| e.len).sum::<u64>(), 10_000);
    }

    #[test]
    fn empty_range_has_no_extents() {
        assert_eq!(extents(5, 0, 4096).count(), 0);
    }
}
