//! One object of the memory store and the undo records that revert changes to it.

use super::data::{Data, SavedPages, PAGE_SIZE};
use bytes::Bytes;
use std::collections::BTreeMap;

/// Charge for an object beyond its name, data and metadata: the map entry and struct.
pub(super) const OBJECT_OVERHEAD: u64 = 128;

/// An object: sparse data plus metadata. Cloning it shares every data page.
#[derive(Clone, Debug, Default)]
pub(super) struct Object {
    pub data: Data,
    pub xattrs: BTreeMap<String, Bytes>,
    pub omap_header: Bytes,
    pub omap: BTreeMap<Bytes, Bytes>,
    /// Bytes of xattr names and values, omap keys and values and the header, kept current so
    /// charging an object is O(1) instead of a walk over its metadata.
    pub meta_bytes: u64,
}

impl Object {
    /// What the object costs beyond [`fixed_charge`]; changes with every mutation.
    pub fn charge(&self) -> u64 {
        self.data.page_count() * PAGE_SIZE as u64 + self.meta_bytes
    }

    /// Sets (or with `None` removes) an xattr, returning the previous value.
    pub fn set_attr(&mut self, name: String, value: Option<Bytes>) -> Option<Bytes> {
        let added = value.as_ref().map_or(0, |v| (name.len() + v.len()) as u64);
        let old = match value {
            Some(v) => self.xattrs.insert(name.clone(), v),
            None => self.xattrs.remove(&name),
        };
        self.meta_bytes =
            self.meta_bytes + added - old.as_ref().map_or(0, |v| (name.len() + v.len()) as u64);
        old
    }

    /// Sets (or with `None` removes) an omap entry, returning the previous value.
    pub fn set_omap(&mut self, key: Bytes, value: Option<Bytes>) -> Option<Bytes> {
        let added = value.as_ref().map_or(0, |v| (key.len() + v.len()) as u64);
        let old = match value {
            Some(v) => self.omap.insert(key.clone(), v),
            None => self.omap.remove(&key),
        };
        self.meta_bytes =
            self.meta_bytes + added - old.as_ref().map_or(0, |v| (key.len() + v.len()) as u64);
        old
    }

    pub fn set_header(&mut self, header: Bytes) -> Bytes {
        self.meta_bytes = self.meta_bytes + header.len() as u64 - self.omap_header.len() as u64;
        std::mem::replace(&mut self.omap_header, header)
    }
}

/// Charge for an object's existence under `name`, independent of its contents.
pub(super) fn fixed_charge(name: &str) -> u64 {
    OBJECT_OVERHEAD + name.len() as u64
}

/// How to revert one change to an object.
pub(super) enum ObjectUndo {
    Data {
        size: u64,
        pages: SavedPages,
    },
    Attrs(Vec<(String, Option<Bytes>)>),
    Omap(Vec<(Bytes, Option<Bytes>)>),
    Header(Bytes),
    OmapCleared {
        omap: BTreeMap<Bytes, Bytes>,
        header: Bytes,
        bytes: u64,
    },
}

impl ObjectUndo {
    pub fn revert(self, obj: &mut Object) {
        match self {
            ObjectUndo::Data { size, pages } => obj.data.restore(size, pages),
            ObjectUndo::Attrs(old) => old
                .into_iter()
                .rev()
                .for_each(|(k, v)| drop(obj.set_attr(k, v))),
            ObjectUndo::Omap(old) => old
                .into_iter()
                .rev()
                .for_each(|(k, v)| drop(obj.set_omap(k, v))),
            ObjectUndo::Header(old) => drop(obj.set_header(old)),
            ObjectUndo::OmapCleared {
                omap,
                header,
                bytes,
            } => {
                obj.omap = omap;
                obj.omap_header = header;
                obj.meta_bytes += bytes;
            }
        }
    }
}
