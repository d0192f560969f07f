//! The SASL_SSL listener every node has beside its PLAINTEXT one.
//!
//! Herald's users reach their brokers over TLS with SASL (SCRAM or PLAIN);
//! only a real broker shows whether a client's TLS and SASL settings reach
//! librdkafka intact and fail closed: an unknown CA, a wrong password. Every
//! node has the listener and advertises it, because a client learns only of
//! the brokers that have the listener it connected through. Inter-broker
//! and controller traffic stay PLAINTEXT: they are not what is tested.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::props::Ports;
use crate::tls;

/// The one user, known to both mechanisms.
const USERNAME: &str = "herald";

/// How a client reaches a cluster's SASL_SSL listener: SCRAM-SHA-512 or
/// PLAIN over TLS, hostname verification included (the server certificate
/// names `localhost` and `127.0.0.1`).
#[derive(Debug, Clone)]
pub struct SecureListener {
    bootstrap: String,
    ca: PathBuf,
    untrusted_ca: PathBuf,
    password: String,
    /// PEM text for the nodes' properties: Kafka takes a PEM key file only
    /// with `ssl.key.password`, and Java 17 cannot decrypt what OpenSSL 3
    /// encrypts by default (PBES2), so the key goes inline, unencrypted.
    pub(crate) server_cert_pem: String,
    pub(crate) server_key_pem: String,
}

impl SecureListener {
    /// Certificates under `tls_dir` and a fresh password, for nodes that
    /// will listen on `ports`.
    pub(crate) fn create(tls_dir: &Path, ports: &[Ports]) -> anyhow::Result<SecureListener> {
        let certs = tls::generate(tls_dir)?;
        let read = |path: &Path| std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()));
        Ok(SecureListener {
            bootstrap: bootstrap(ports),
            server_cert_pem: read(&certs.server_cert)?,
            server_key_pem: read(&certs.server_key)?,
            ca: certs.ca,
            untrusted_ca: certs.untrusted_ca,
            password: uuid::Uuid::new_v4().simple().to_string(),
        })
    }

    /// Bootstrap servers for `security.protocol=SASL_SSL`: every node.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The CA certificate (PEM) to trust: `ssl.ca.location`.
    pub fn ca_path(&self) -> &Path {
        &self.ca
    }

    /// A CA certificate (PEM) that signed nothing the cluster uses: a
    /// client trusting only this must refuse the brokers.
    pub fn untrusted_ca_path(&self) -> &Path {
        &self.untrusted_ca
    }

    pub fn username(&self) -> &str {
        USERNAME
    }

    /// Random per cluster, for SCRAM-SHA-512 and PLAIN alike.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The storage tool's `--add-scram` value: SCRAM credentials live in
    /// the metadata log, so they are written when the storage is formatted
    /// rather than through an admin call after start.
    pub(crate) fn scram_credential(&self) -> String {
        format!("SCRAM-SHA-512=[name={USERNAME},password={}]", self.password)
    }
}

fn bootstrap(ports: &[Ports]) -> String {
    ports.iter().map(|p| format!("127.0.0.1:{}", p.secure)).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
impl SecureListener {
    /// Without openssl: placeholder PEM and a fixed password.
    pub(crate) fn example(ports: &[Ports]) -> SecureListener {
        SecureListener {
            bootstrap: bootstrap(ports),
            ca: PathBuf::from("/tls/ca.pem"),
            untrusted_ca: PathBuf::from("/tls/untrusted-ca.pem"),
            password: "example-password".to_owned(),
            server_cert_pem: "-----BEGIN CERTIFICATE-----\nMIIB\r\nAAAA\n-----END CERTIFICATE-----\n".to_owned(),
            server_key_pem: "-----BEGIN PRIVATE KEY-----\nMIGH\nBBBB\n-----END PRIVATE KEY-----\n".to_owned(),
        }
    }
}
