use bytes::Bytes;
use carmine_types::CollectionId;

/// One mutation inside a [`Transaction`]. Ops apply in order; a later op sees earlier ones.
///
/// Creation rules: `Touch`, `Write`, `Zero`, `Truncate`, `SetAttrs` and the omap setters create
/// a missing object. `Remove`, `RmAttr`, `OmapRmKeys`, `OmapClear` and `Clone`/`CloneRange`
/// (source) need the object to exist. `Clone` replaces an existing destination. `RmAttr` of an
/// absent attribute succeeds. `CreateCollection` of an existing collection and
/// `RemoveCollection` of a non-empty one fail.
///
/// `Compare` ops are guards: they must all come before the first other op (else the whole
/// transaction is `InvalidArgument`), they see the state before the transaction, and when one
/// does not hold the transaction changes nothing and fails with `ObjectExists` (for
/// [`Expect::Absent`]) or `CompareFailed`. Check and change are one atomic step, so two
/// clients racing on a compare-and-set never both win.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Compare {
        cid: CollectionId,
        oid: String,
        expect: Expect,
    },
    CreateCollection {
        cid: CollectionId,
    },
    RemoveCollection {
        cid: CollectionId,
    },
    Touch {
        cid: CollectionId,
        oid: String,
    },
    Write {
        cid: CollectionId,
        oid: String,
        off: u64,
        data: Bytes,
    },
    /// Zeros `[off, off+len)`, extending the object if needed; backends may deallocate.
    Zero {
        cid: CollectionId,
        oid: String,
        off: u64,
        len: u64,
    },
    Truncate {
        cid: CollectionId,
        oid: String,
        size: u64,
    },
    Remove {
        cid: CollectionId,
        oid: String,
    },
    SetAttrs {
        cid: CollectionId,
        oid: String,
        attrs: Vec<(String, Bytes)>,
    },
    RmAttr {
        cid: CollectionId,
        oid: String,
        name: String,
    },
    OmapSetKeys {
        cid: CollectionId,
        oid: String,
        kvs: Vec<(Bytes, Bytes)>,
    },
    OmapRmKeys {
        cid: CollectionId,
        oid: String,
        keys: Vec<Bytes>,
    },
    OmapClear {
        cid: CollectionId,
        oid: String,
    },
    OmapSetHeader {
        cid: CollectionId,
        oid: String,
        header: Bytes,
    },
    /// Makes `dst` a full copy of `src`: data, size, xattrs, omap header and keys.
    Clone {
        cid: CollectionId,
        src: String,
        dst: String,
    },
    /// Copies `[src_off, src_off+len)` of `src` to `dst_off` in `dst` (created if missing).
    /// Bytes beyond the end of `src` copy as zeros; `dst` grows to at least `dst_off+len`.
    CloneRange {
        cid: CollectionId,
        src: String,
        dst: String,
        src_off: u64,
        len: u64,
        dst_off: u64,
    },
}

/// What a [`Op::Compare`] requires of its object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The object does not exist.
    Absent,
    /// Xattr `name` holds exactly `value`; `None`: the attribute (or the object) is absent.
    Xattr { name: String, value: Option<Bytes> },
    /// Omap `key` holds exactly `value`; `None`: the key (or the object) is absent.
    OmapKey { key: Bytes, value: Option<Bytes> },
}

/// An ordered list of ops applied atomically by [`crate::ObjectStore::submit`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transaction {
    pub ops: Vec<Op>,
}

impl Op {
    /// The objects the op names: one, a clone's source and destination, or none (collection
    /// ops).
    pub fn objects(&self) -> [Option<(CollectionId, &str)>; 2] {
        match self {
            Op::CreateCollection { .. } | Op::RemoveCollection { .. } => [None, None],
            Op::Clone { cid, src, dst } | Op::CloneRange { cid, src, dst, .. } => {
                [Some((*cid, src.as_str())), Some((*cid, dst.as_str()))]
            }
            Op::Compare { cid, oid, .. }
            | Op::Touch { cid, oid }
            | Op::Write { cid, oid, .. }
            | Op::Zero { cid, oid, .. }
            | Op::Truncate { cid, oid, .. }
            | Op::Remove { cid, oid }
            | Op::SetAttrs { cid, oid, .. }
            | Op::RmAttr { cid, oid, .. }
            | Op::OmapSetKeys { cid, oid, .. }
            | Op::OmapRmKeys { cid, oid, .. }
            | Op::OmapClear { cid, oid }
            | Op::OmapSetHeader { cid, oid, .. } => [Some((*cid, oid.as_str())), None],
        }
    }
}

impl Transaction {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with_capacity(n: usize) -> Self {
        Self {
            ops: Vec::with_capacity(n),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    pub fn push(&mut self, op: Op) -> &mut Self {
        self.ops.push(op);
        self
    }
    pub fn compare(&mut self, cid: CollectionId, oid: &str, expect: Expect) -> &mut Self {
        self.push(Op::Compare {
            cid,
            oid: oid.into(),
            expect,
        })
    }
    pub fn create_collection(&mut self, cid: CollectionId) -> &mut Self {
        self.push(Op::CreateCollection { cid })
    }
    pub fn remove_collection(&mut self, cid: CollectionId) -> &mut Self {
        self.push(Op::RemoveCollection { cid })
    }
    pub fn touch(&mut self, cid: CollectionId, oid: &str) -> &mut Self {
        self.push(Op::Touch {
            cid,
            oid: oid.into(),
        })
    }
    pub fn write(&mut self, cid: CollectionId, oid: &str, off: u64, data: Bytes) -> &mut Self {
        self.push(Op::Write {
            cid,
            oid: oid.into(),
            off,
            data,
        })
    }
    pub fn zero(&mut self, cid: CollectionId, oid: &str, off: u64, len: u64) -> &mut Self {
        self.push(Op::Zero {
            cid,
            oid: oid.into(),
            off,
            len,
        })
    }
    pub fn truncate(&mut self, cid: CollectionId, oid: &str, size: u64) -> &mut Self {
        self.push(Op::Truncate {
            cid,
            oid: oid.into(),
            size,
        })
    }
    pub fn remove(&mut self, cid: CollectionId, oid: &str) -> &mut Self {
        self.push(Op::Remove {
            cid,
            oid: oid.into(),
        })
    }
    pub fn setattr(&mut self, cid: CollectionId, oid: &str, name: &str, value: Bytes) -> &mut Self {
        self.push(Op::SetAttrs {
            cid,
            oid: oid.into(),
            attrs: vec![(name.into(), value)],
        })
    }
    pub fn rmattr(&mut self, cid: CollectionId, oid: &str, name: &str) -> &mut Self {
        self.push(Op::RmAttr {
            cid,
            oid: oid.into(),
            name: name.into(),
        })
    }
    pub fn omap_set(
        &mut self,
        cid: CollectionId,
        oid: &str,
        kvs: Vec<(Bytes, Bytes)>,
    ) -> &mut Self {
        self.push(Op::OmapSetKeys {
            cid,
            oid: oid.into(),
            kvs,
        })
    }
    pub fn omap_rm(&mut self, cid: CollectionId, oid: &str, keys: Vec<Bytes>) -> &mut Self {
        self.push(Op::OmapRmKeys {
            cid,
            oid: oid.into(),
            keys,
        })
    }
    pub fn omap_clear(&mut self, cid: CollectionId, oid: &str) -> &mut Self {
        self.push(Op::OmapClear {
            cid,
            oid: oid.into(),
        })
    }
    pub fn omap_set_header(&mut self, cid: CollectionId, oid: &str, header: Bytes) -> &mut Self {
        self.push(Op::OmapSetHeader {
            cid,
            oid: oid.into(),
            header,
        })
    }
    pub fn clone_object(&mut self, cid: CollectionId, src: &str, dst: &str) -> &mut Self {
        self.push(Op::Clone {
            cid,
            src: src.into(),
            dst: dst.into(),
        })
    }
    pub fn clone_range(
        &mut self,
        cid: CollectionId,
        src: &str,
        dst: &str,
        src_off: u64,
        len: u64,
        dst_off: u64,
    ) -> &mut Self {
        self.push(Op::CloneRange {
            cid,
            src: src.into(),
            dst: dst.into(),
            src_off,
            len,
            dst_off,
        })
    }
}
