//! The image header: a small versioned, checksummed record kept in the header object.

use crate::VolumeError;
use bytes::{Bytes, BytesMut};
use carmine_types::limits::IO_LEN_MAX;
use carmine_types::{crc32c, Decoder, Encoder};

const HEADER_MAGIC: u32 = u32::from_le_bytes(*b"CIMG");
const HEADER_VERSION: u16 = 1;
/// The version of the header of an incomplete copy: builds that know no feature bits (they
/// read version 1 only) refuse it instead of opening a partial copy.
const HEADER_VERSION_INCOMPLETE: u16 = 2;
pub const OBJECT_SIZE_DEFAULT: u64 = 4 << 20;
pub const OBJECT_SIZE_MIN: u64 = 4096;
/// One object must fit one data op.
pub const OBJECT_SIZE_MAX: u64 = IO_LEN_MAX as u64;
/// Largest image: 2^50 bytes (1 PiB) keeps object numbers and offsets far from overflow.
pub const IMAGE_SIZE_MAX: u64 = 1 << 50;
/// Feature bit: the image is a copy being made, or one cut short (`Volumes::copy_to`; a
/// killed copier leaves it): its data may be partial, so it is not opened. `volume rm`
/// removes it.
pub const FEATURE_INCOMPLETE: u64 = 1;
/// Every feature bit this build knows: an image with another is not used (a newer build's,
/// whose meaning this one would miss), though it may be removed.
const FEATURES_KNOWN: u64 = FEATURE_INCOMPLETE;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    pub name: String,
    pub id: String,
    pub size: u64,
    pub object_size: u64,
    /// Feature bits: [`FEATURE_INCOMPLETE`].
    pub features: u64,
}

impl ImageInfo {
    pub(crate) fn new(
        name: &str,
        id: String,
        size: u64,
        object_size: u64,
    ) -> Result<Self, VolumeError> {
        if !object_size.is_power_of_two()
            || !(OBJECT_SIZE_MIN..=OBJECT_SIZE_MAX).contains(&object_size)
        {
            return Err(VolumeError::InvalidArgument(format!(
                "object size {object_size} must be a power of two from {OBJECT_SIZE_MIN} to {OBJECT_SIZE_MAX}"
            )));
        }
        if size > IMAGE_SIZE_MAX {
            return Err(VolumeError::InvalidArgument(format!(
                "size {size} exceeds the maximum {IMAGE_SIZE_MAX}"
            )));
        }
        Ok(Self {
            name: name.into(),
            id,
            size,
            object_size,
            features: 0,
        })
    }

    /// Whether it is a copy not (yet) complete: see [`FEATURE_INCOMPLETE`].
    pub fn is_incomplete(&self) -> bool {
        self.features & FEATURE_INCOMPLETE != 0
    }

    /// Refuses an image this build must not read or write: an incomplete copy, or one with
    /// feature bits it does not know. (Removing either is fine: that needs only the size.)
    pub(crate) fn check_usable(&self) -> Result<(), VolumeError> {
        if self.is_incomplete() {
            return Err(VolumeError::Incomplete {
                name: self.name.clone(),
            });
        }
        let unknown = self.features & !FEATURES_KNOWN;
        if unknown != 0 {
            return Err(VolumeError::InvalidArgument(format!(
                "image {:?} has features {unknown:#x} this build does not know (made by a \
                 newer one)",
                self.name
            )));
        }
        Ok(())
    }

    /// Number of data objects the image can have.
    pub fn object_count(&self) -> u64 {
        self.size.div_ceil(self.object_size)
    }

    pub(crate) fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        let version = if self.is_incomplete() {
            HEADER_VERSION_INCOMPLETE
        } else {
            HEADER_VERSION
        };
        Encoder::new(&mut out)
            .u32(HEADER_MAGIC)
            .u16(version)
            .u64(self.size)
            .u64(self.object_size)
            .u64(self.features)
            .str(&self.id)
            .str(&self.name);
        let crc = crc32c(&out);
        Encoder::new(&mut out).u32(crc);
        out.freeze()
    }

    pub(crate) fn decode(name: &str, raw: Bytes) -> Result<Self, VolumeError> {
        let corrupt = |detail: String| VolumeError::Corrupt {
            name: name.into(),
            detail,
        };
        if raw.len() < 4 {
            return Err(corrupt("header too short".into()));
        }
        let body = raw.len() - 4;
        let stored = u32::from_le_bytes(raw[body..].try_into().expect("4 bytes"));
        if crc32c(&raw[..body]) != stored {
            return Err(corrupt("header checksum mismatch".into()));
        }
        let mut d = Decoder::new(raw.slice(..body));
        let parse = |d: &mut Decoder| -> Result<ImageInfo, carmine_types::DecodeError> {
            let magic = d.u32("magic")?;
            let version = d.u16("version")?;
            if magic != HEADER_MAGIC
                || !(HEADER_VERSION..=HEADER_VERSION_INCOMPLETE).contains(&version)
            {
                return Err(carmine_types::DecodeError::Invalid {
                    what: "header magic/version",
                    found: version as u64,
                });
            }
            let size = d.u64("size")?;
            let object_size = d.u64("object size")?;
            // Canonical: version 2 exactly when the copy is incomplete.
            let features = d.u64("features")?;
            if (features & FEATURE_INCOMPLETE != 0) != (version == HEADER_VERSION_INCOMPLETE) {
                return Err(carmine_types::DecodeError::Invalid {
                    what: "image features for its header version",
                    found: features,
                });
            }
            let id = d.string("id", 64)?;
            let name = d.string("name", 256)?;
            d.finish("image header")?;
            Ok(ImageInfo {
                name,
                id,
                size,
                object_size,
                features,
            })
        };
        let info = parse(&mut d).map_err(|e| corrupt(e.to_string()))?;
        ImageInfo::new(&info.name, info.id.clone(), info.size, info.object_size)
            .map_err(|e| corrupt(e.to_string()))
            .map(|_| info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let info = ImageInfo::new("vm-disk", "00ff".into(), 10 << 30, 4 << 20).unwrap();
        assert_eq!(ImageInfo::decode("vm-disk", info.encode()).unwrap(), info);
    }

    #[test]
    fn an_incomplete_copy_has_a_header_older_builds_refuse_and_unknown_features_are_not_used() {
        let mut info = ImageInfo::new("c", "01".into(), 1 << 20, 4 << 20).unwrap();
        info.features = FEATURE_INCOMPLETE;
        let raw = info.encode();
        assert_eq!(
            u16::from_le_bytes([raw[4], raw[5]]),
            HEADER_VERSION_INCOMPLETE
        );
        assert_eq!(ImageInfo::decode("c", raw.clone()).unwrap(), info);
        // Either half of the pair alone is not a header this build writes.
        let mut v1 = raw.to_vec();
        v1[4] = HEADER_VERSION as u8;
        let body = v1.len() - 4;
        let crc = crc32c(&v1[..body]).to_le_bytes();
        v1[body..].copy_from_slice(&crc);
        assert!(matches!(
            ImageInfo::decode("c", Bytes::from(v1)),
            Err(VolumeError::Corrupt { .. })
        ));
        info.features = 0;
        let raw = info.encode();
        assert_eq!(u16::from_le_bytes([raw[4], raw[5]]), HEADER_VERSION);
        info.check_usable().unwrap();
        // A newer build's feature: decoded (it may be removed), not used.
        info.features = 1 << 7;
        let newer = ImageInfo::decode("c", info.encode()).unwrap();
        assert!(matches!(
            newer.check_usable(),
            Err(VolumeError::InvalidArgument(_))
        ));
        info.features = FEATURE_INCOMPLETE;
        assert!(matches!(
            info.check_usable(),
            Err(VolumeError::Incomplete { .. })
        ));
    }

    #[test]
    fn damaged_header_is_reported_not_trusted() {
        let info = ImageInfo::new("a", "1".into(), 1 << 20, 4 << 20).unwrap();
        let mut raw = info.encode().to_vec();
        raw[8] ^= 1;
        assert!(matches!(
            ImageInfo::decode("a", Bytes::from(raw)),
            Err(VolumeError::Corrupt { .. })
        ));
    }

    #[test]
    fn object_size_must_be_a_bounded_power_of_two() {
        assert!(ImageInfo::new("a", "1".into(), 1, 3 << 20).is_err());
        assert!(ImageInfo::new("a", "1".into(), 1, 1024).is_err());
        assert!(ImageInfo::new("a", "1".into(), 1, 32 << 20).is_err());
        assert!(ImageInfo::new("a", "1".into(), 1, 64 << 10).is_ok());
    }
}
