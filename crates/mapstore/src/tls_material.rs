//! The TLS material and root password of a secured private etcd, made once into
//! `<dir>/etcd-tls/` and reused on every restart: a CA of its own, a server certificate for
//! 127.0.0.1 signed by it, a client certificate for Carmine's daemons, and etcd's root
//! password. Keys and the password are written mode 0600.

use crate::{EtcdAccess, MapStoreError};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// Where the files are, by role.
pub(crate) struct TlsMaterial {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client: EtcdAccess,
}

fn failed(what: &str, e: impl std::fmt::Display) -> MapStoreError {
    MapStoreError::Unavailable(format!(
        "making the private etcd's TLS material: {what}: {e}"
    ))
}

fn write_private(path: &Path, text: &str) -> Result<(), MapStoreError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| failed(&path.display().to_string(), e))?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| failed(&path.display().to_string(), e))
}

fn random_password() -> String {
    let bytes: [u8; 24] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl TlsMaterial {
    /// The material in `dir/etcd-tls`, made if it is not there yet. A half-made directory (a
    /// crash while making it) is made again from scratch: nothing has used it yet.
    pub fn ensure(dir: &Path) -> Result<Self, MapStoreError> {
        let tls = dir.join("etcd-tls");
        let m = TlsMaterial {
            ca: tls.join("ca.pem"),
            server_cert: tls.join("server.pem"),
            server_key: tls.join("server.key"),
            client: EtcdAccess {
                ca: Some(tls.join("ca.pem")),
                cert: Some(tls.join("client.pem")),
                key: Some(tls.join("client.key")),
                user: Some("root".into()),
                password_file: Some(tls.join("root.password")),
            },
        };
        let done = tls.join("complete");
        if done.exists() {
            return Ok(m);
        }
        let _ = std::fs::remove_dir_all(&tls);
        std::fs::create_dir_all(&tls).map_err(|e| failed("creating etcd-tls", e))?;

        let ca_key = KeyPair::generate().map_err(|e| failed("CA key", e))?;
        let mut ca_params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| failed("CA", e))?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "carmine private etcd CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = ca_params
            .self_signed(&ca_key)
            .map_err(|e| failed("CA", e))?;

        let leaf = |name: &str, sans: Vec<String>| -> Result<(String, String), MapStoreError> {
            let key = KeyPair::generate().map_err(|e| failed(name, e))?;
            let mut p = CertificateParams::new(sans).map_err(|e| failed(name, e))?;
            // No CommonName on the client's: etcd's JSON gateway refuses requests whose
            // certificate has one when auth is on (it cannot map it to a user). The server's
            // is named by its addresses.
            p.distinguished_name = DistinguishedName::new();
            let _ = name;
            p.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            // The server needs client use too: etcd's JSON gateway dials etcd's own gRPC
            // port with the server certificate when client certificates are required.
            p.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let cert = p
                .signed_by(&key, &ca, &ca_key)
                .map_err(|e| failed(name, e))?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let (server_pem, server_key) = leaf("etcd", vec!["127.0.0.1".into(), "localhost".into()])?;
        let (client_pem, client_key) = leaf("carmine", vec!["carmine-client".into()])?;
        let client = &m.client;
        std::fs::write(&m.ca, ca.pem()).map_err(|e| failed("ca.pem", e))?;
        std::fs::write(&m.server_cert, server_pem).map_err(|e| failed("server.pem", e))?;
        write_private(&m.server_key, &server_key)?;
        std::fs::write(client.cert.as_ref().expect("set"), client_pem)
            .map_err(|e| failed("client.pem", e))?;
        write_private(client.key.as_ref().expect("set"), &client_key)?;
        write_private(
            client.password_file.as_ref().expect("set"),
            &format!("{}\n", random_password()),
        )?;
        std::fs::write(&done, b"").map_err(|e| failed("complete", e))?;
        Ok(m)
    }
}
