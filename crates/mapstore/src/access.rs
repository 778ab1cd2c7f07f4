//! How Carmine reaches an etcd that is secured: TLS (the CA that signed etcd's certificate, and
//! a client certificate when etcd asks for one, `--client-cert-auth`) and etcd's own users
//! (`etcdctl auth enable`: a user name and a password read from a private file). All of it is
//! optional; an `http://` etcd without auth needs none of it.

use crate::MapStoreError;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// TLS files and credentials for etcd; paths, never secrets, so it can be stored in a
/// cluster's settings and passed on command lines.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdAccess {
    /// PEM file of the CA(s) that signed etcd's server certificate (for `https://`
    /// endpoints; without it the public web roots that ureq bundles are trusted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// PEM client certificate, for an etcd started with `--client-cert-auth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// etcd user (etcd auth enabled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// File holding `user`'s password (one line; must not be readable by others).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
}

/// A user and password to authenticate with.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password never reaches a log.
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish()
    }
}

fn invalid(s: String) -> MapStoreError {
    MapStoreError::Invalid(s)
}

impl EtcdAccess {
    pub fn is_empty(&self) -> bool {
        *self == EtcdAccess::default()
    }

    /// Whether etcd can tell who is asking (a client certificate or a user): then what is
    /// stored there is not for anyone who reaches its port.
    pub fn authenticates(&self) -> bool {
        self.cert.is_some() || self.user.is_some()
    }

    /// The options as `carmine osd` and `carmine mgr` take them.
    pub fn to_args(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut path = |flag: &str, p: &Option<PathBuf>| {
            if let Some(p) = p {
                out.push(flag.to_owned());
                out.push(p.display().to_string());
            }
        };
        path("--etcd-ca", &self.ca);
        path("--etcd-cert", &self.cert);
        path("--etcd-key", &self.key);
        path("--etcd-password-file", &self.password_file);
        if let Some(u) = &self.user {
            out.push("--etcd-user".into());
            out.push(u.clone());
        }
        out
    }

    /// Checks the combination and reads the password.
    pub(crate) fn credentials(&self) -> Result<Option<Credentials>, MapStoreError> {
        match (&self.user, &self.password_file) {
            (None, None) => Ok(None),
            (Some(_), None) | (None, Some(_)) => Err(invalid(
                "etcd auth needs both a user and a password file".into(),
            )),
            (Some(user), Some(file)) => Ok(Some(Credentials {
                user: user.clone(),
                password: read_password(file)?,
            })),
        }
    }

    /// The HTTP agent: TLS with the given CA and client certificate, or ureq's default
    /// (public roots) when neither is given.
    pub(crate) fn agent(&self) -> Result<ureq::Agent, MapStoreError> {
        let builder = ureq::AgentBuilder::new();
        if self.ca.is_none() && self.cert.is_none() && self.key.is_none() {
            return Ok(builder.build());
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let Some(ca) = &self.ca else {
            return Err(invalid(
                "an etcd client certificate needs the CA of etcd's own (--etcd-ca)".into(),
            ));
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in read_certs(ca)? {
            roots
                .add(cert)
                .map_err(|e| invalid(format!("etcd CA {}: not a usable CA: {e}", ca.display())))?;
        }
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(format!("TLS setup: {e}")))?
            .with_root_certificates(roots);
        let config = match (&self.cert, &self.key) {
            (None, None) => config.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = read_certs(cert)?;
                let key_der = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| invalid(format!("etcd client key {}: {e}", key.display())))?;
                config
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| invalid(format!("etcd client certificate: {e}")))?
            }
            _ => {
                return Err(invalid(
                    "an etcd client certificate needs both --etcd-cert and --etcd-key".into(),
                ))
            }
        };
        Ok(builder.tls_config(Arc::new(config)).build())
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, MapStoreError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| invalid(format!("reading certificates from {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(invalid(format!(
            "{} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// The password in `file` (its first line), refusing a file that others may read, as ssh
/// does with keys.
fn read_password(file: &Path) -> Result<String, MapStoreError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(file)
        .map_err(|e| invalid(format!("etcd password file {}: {e}", file.display())))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(invalid(format!(
            "etcd password file {} may be read by others (mode {:o}): chmod 600 it",
            file.display(),
            meta.permissions().mode() & 0o777
        )));
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| invalid(format!("etcd password file {}: {e}", file.display())))?;
    let password = text.lines().next().unwrap_or("").to_owned();
    if password.is_empty() {
        return Err(invalid(format!(
            "etcd password file {} is empty",
            file.display()
        )));
    }
    Ok(password)
}
