//! The handshake that opens every connection to a daemon whose cluster has a key: a mutual
//! challenge–response over fresh nonces with HMAC-SHA256, as cephx does, before any request is
//! read. Pure encoding and proofs here; the I/O is in the client and the OSD.
//!
//! ```text
//! client → Hello     {version, client_nonce[32], entity}            (Auth request, id 1)
//! server → Challenge {server_nonce[32], server_proof[32]}           (Auth response, id 1)
//! client → Proof     {client_proof[32]}                             (Auth request, id 2)
//! server → Ok (empty) or AuthFailed with a message, then it closes  (Auth response, id 2)
//!
//! server_proof = HMAC(key, "carmine-auth-v1 server" ‖ client_nonce ‖ server_nonce ‖ entity)
//! client_proof = HMAC(key, "carmine-auth-v1 client" ‖ client_nonce ‖ server_nonce ‖ entity)
//! ```
//!
//! The client checks the server's proof before it proves anything itself, so it never talks to
//! a daemon that lacks the key; the server's fresh nonce makes a recorded client proof
//! worthless on any other connection, and the client's makes a recorded server proof
//! worthless too. The two proofs differ by their labels, so one side's proof is never the
//! other's.

use bytes::{Bytes, BytesMut};
use carmine_types::{DecodeError, Decoder, Encoder};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::Path;

pub const AUTH_VERSION: u16 = 1;
pub const NONCE_LEN: usize = 32;
pub const PROOF_LEN: usize = 32;
pub const KEY_LEN: usize = 32;
const ENTITY_LEN_MAX: usize = 64;

/// A cluster key: 32 secret bytes, kept as 64 hex characters in a file of mode 0600.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthKey([u8; KEY_LEN]);

impl std::fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthKey(..)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is readable or writable by others (mode {mode:04o}): a cluster key must be 0600 (chmod 600 {path})")]
    Exposed { path: String, mode: u32 },
    #[error("{path} does not hold a key: expected {} hex characters", KEY_LEN * 2)]
    Malformed { path: String },
}

impl AuthKey {
    pub fn from_bytes(b: [u8; KEY_LEN]) -> Self {
        AuthKey(b)
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn parse_hex(s: &str) -> Option<Self> {
        let s = s.trim();
        if s.len() != KEY_LEN * 2 || !s.is_ascii() {
            return None;
        }
        let mut k = [0u8; KEY_LEN];
        for (i, b) in k.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(AuthKey(k))
    }

    /// Reads a key file, refusing one that others may read or write.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        use std::os::unix::fs::PermissionsExt;
        let p = path.display().to_string();
        let io = |source| KeyError::Io {
            path: p.clone(),
            source,
        };
        let mode = std::fs::metadata(path).map_err(io)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Exposed { path: p, mode });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        AuthKey::parse_hex(&text).ok_or(KeyError::Malformed { path: p })
    }

    /// Writes a new key file, mode 0600 from its creation; an existing file is not replaced.
    pub fn create_file(&self, path: &Path) -> Result<(), KeyError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let io = |source| KeyError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        writeln!(f, "{}", self.to_hex()).map_err(io)?;
        f.sync_all().map_err(io)
    }

    fn proof(
        &self,
        label: &[u8],
        client: &[u8; NONCE_LEN],
        server: &[u8; NONCE_LEN],
        entity: &str,
    ) -> [u8; PROOF_LEN] {
        self.mac(label, client, server, entity)
            .finalize()
            .into_bytes()
            .into()
    }

    fn mac(
        &self,
        label: &[u8],
        client: &[u8; NONCE_LEN],
        server: &[u8; NONCE_LEN],
        entity: &str,
    ) -> Hmac<Sha256> {
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(label);
        m.update(client);
        m.update(server);
        m.update(entity.as_bytes());
        m
    }

    pub fn server_proof(
        &self,
        client: &[u8; NONCE_LEN],
        server: &[u8; NONCE_LEN],
        entity: &str,
    ) -> [u8; PROOF_LEN] {
        self.proof(SERVER_LABEL, client, server, entity)
    }

    pub fn client_proof(
        &self,
        client: &[u8; NONCE_LEN],
        server: &[u8; NONCE_LEN],
        entity: &str,
    ) -> [u8; PROOF_LEN] {
        self.proof(CLIENT_LABEL, client, server, entity)
    }

    /// Checks a proof in constant time.
    pub fn verify(
        &self,
        server_side: bool,
        client: &[u8; NONCE_LEN],
        server: &[u8; NONCE_LEN],
        entity: &str,
        proof: &[u8],
    ) -> bool {
        let label = if server_side {
            SERVER_LABEL
        } else {
            CLIENT_LABEL
        };
        self.mac(label, client, server, entity)
            .verify_slice(proof)
            .is_ok()
    }
}

const SERVER_LABEL: &[u8] = b"carmine-auth-v1 server";
const CLIENT_LABEL: &[u8] = b"carmine-auth-v1 client";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub nonce: [u8; NONCE_LEN],
    /// Who connects, e.g. `client.admin`, `osd.3`: bound into both proofs.
    pub entity: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    pub nonce: [u8; NONCE_LEN],
    pub proof: [u8; PROOF_LEN],
}

fn array<const N: usize>(d: &mut Decoder, what: &'static str) -> Result<[u8; N], DecodeError> {
    let b = d.bytes(what, N)?;
    b.as_ref().try_into().map_err(|_| DecodeError::Truncated {
        what,
        needed: N,
        available: b.len(),
    })
}

impl Hello {
    pub fn encode(&self, out: &mut BytesMut) {
        Encoder::new(out)
            .u16(AUTH_VERSION)
            .bytes(&self.nonce)
            .str(&self.entity);
    }

    pub fn decode(payload: Bytes) -> Result<Self, AuthDecodeError> {
        let mut d = Decoder::new(payload);
        let version = d.u16("auth version")?;
        if version != AUTH_VERSION {
            return Err(AuthDecodeError::Version(version));
        }
        let nonce = array(&mut d, "client nonce")?;
        let entity = d.string("entity", ENTITY_LEN_MAX)?;
        d.finish("hello")?;
        Ok(Hello { nonce, entity })
    }
}

impl Challenge {
    pub fn encode(&self, out: &mut BytesMut) {
        Encoder::new(out).bytes(&self.nonce).bytes(&self.proof);
    }

    pub fn decode(payload: Bytes) -> Result<Self, AuthDecodeError> {
        let mut d = Decoder::new(payload);
        let nonce = array(&mut d, "server nonce")?;
        let proof = array(&mut d, "server proof")?;
        d.finish("challenge")?;
        Ok(Challenge { nonce, proof })
    }
}

pub fn encode_proof(out: &mut BytesMut, proof: &[u8; PROOF_LEN]) {
    Encoder::new(out).bytes(proof);
}

pub fn decode_proof(payload: Bytes) -> Result<[u8; PROOF_LEN], AuthDecodeError> {
    let mut d = Decoder::new(payload);
    let proof = array(&mut d, "client proof")?;
    d.finish("proof")?;
    Ok(proof)
}

#[derive(Debug, thiserror::Error)]
pub enum AuthDecodeError {
    #[error("malformed handshake message: {0}")]
    Decode(#[from] DecodeError),
    #[error("unsupported handshake version {0} (this build speaks {AUTH_VERSION})")]
    Version(u16),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> AuthKey {
        AuthKey::from_bytes([b; KEY_LEN])
    }

    #[test]
    fn proofs_bind_the_key_both_nonces_the_entity_and_the_side() {
        let (c, s) = ([1u8; NONCE_LEN], [2u8; NONCE_LEN]);
        let k = key(9);
        let p = k.client_proof(&c, &s, "client.admin");
        assert!(k.verify(false, &c, &s, "client.admin", &p));
        assert!(
            !key(8).verify(false, &c, &s, "client.admin", &p),
            "another key"
        );
        assert!(
            !k.verify(false, &c, &[3; NONCE_LEN], "client.admin", &p),
            "another server nonce (a replay)"
        );
        assert!(
            !k.verify(false, &[3; NONCE_LEN], &s, "client.admin", &p),
            "another client nonce"
        );
        assert!(
            !k.verify(false, &c, &s, "client.other", &p),
            "another entity"
        );
        assert!(
            !k.verify(true, &c, &s, "client.admin", &p),
            "a client proof is not a server proof"
        );
        assert!(
            !k.verify(false, &c, &s, "client.admin", &p[..31]),
            "a truncated proof"
        );
        let sp = k.server_proof(&c, &s, "client.admin");
        assert!(k.verify(true, &c, &s, "client.admin", &sp));
        assert_ne!(sp, p);
    }

    #[test]
    fn messages_round_trip_and_garbage_is_an_error() {
        let h = Hello {
            nonce: [7; NONCE_LEN],
            entity: "client.admin".into(),
        };
        let mut b = BytesMut::new();
        h.encode(&mut b);
        assert_eq!(Hello::decode(b.clone().freeze()).unwrap(), h);
        let mut bad = b.clone();
        bad[0] = 9;
        assert!(matches!(
            Hello::decode(bad.freeze()),
            Err(AuthDecodeError::Version(9))
        ));
        assert!(Hello::decode(b.split_to(10).freeze()).is_err());
        let c = Challenge {
            nonce: [1; NONCE_LEN],
            proof: [2; PROOF_LEN],
        };
        let mut b = BytesMut::new();
        c.encode(&mut b);
        assert_eq!(Challenge::decode(b.freeze()).unwrap(), c);
        let mut b = BytesMut::new();
        encode_proof(&mut b, &[5; PROOF_LEN]);
        assert_eq!(decode_proof(b.clone().freeze()).unwrap(), [5; PROOF_LEN]);
        b.extend_from_slice(b"x");
        assert!(decode_proof(b.freeze()).is_err());
    }

    #[test]
    fn key_files_are_0600_and_refused_otherwise() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("carmine-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cluster.key");
        let k = key(0xab);
        k.create_file(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(AuthKey::load(&path).unwrap(), k);
        assert!(
            k.create_file(&path).is_err(),
            "an existing key is never replaced"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = AuthKey::load(&path).unwrap_err().to_string();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "not a key\n").unwrap();
        assert!(matches!(
            AuthKey::load(&path),
            Err(KeyError::Malformed { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
