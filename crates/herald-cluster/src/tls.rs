//! Certificates for the SASL_SSL listener, made with the `openssl` CLI when
//! a cluster starts: a throwaway CA per cluster means no key or expiry date
//! is ever checked into the repository, and a Rust TLS stack is not worth
//! compiling for a test fixture.
//!
//! EC P-256 keys: generating them takes milliseconds where RSA would spend
//! a noticeable part of a second per key on a loaded 2-core machine.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

/// Files under the cluster's `tls/` directory.
pub(crate) struct Certificates {
    /// The CA that signed the server certificate: what clients trust.
    pub ca: PathBuf,
    /// A second CA that signed nothing, for tests in which a client must
    /// refuse the server.
    pub untrusted_ca: PathBuf,
    /// The server certificate, SAN `DNS:localhost,IP:127.0.0.1`, so a
    /// client that verifies hostnames accepts it under either name.
    pub server_cert: PathBuf,
    /// The server's key, unencrypted PKCS#8 (what `openssl req` writes).
    pub server_key: PathBuf,
}

/// Makes both CAs and the server certificate under `dir`.
pub(crate) fn generate(dir: &Path) -> anyhow::Result<Certificates> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = |name: &str| dir.join(name);
    let certs = Certificates {
        ca: path("ca.pem"),
        untrusted_ca: path("untrusted-ca.pem"),
        server_cert: path("server.pem"),
        server_key: path("server.key"),
    };
    self_signed_ca(&path("ca.key"), &certs.ca, "Herald test CA")?;
    self_signed_ca(&path("untrusted-ca.key"), &certs.untrusted_ca, "Herald untrusted test CA")?;

    let csr = path("server.csr");
    openssl(|c| {
        c.args(["req", "-new", "-nodes"]).args(NEW_KEY).arg("-keyout").arg(&certs.server_key);
        c.arg("-out").arg(&csr).args(["-subj", "/CN=localhost"])
    })?;
    // `x509 -req` copies no extension from the request; the SAN has to come
    // from a file (`-extfile`), as OpenSSL 1.1 has no `-copy_extensions`.
    let extensions = path("server.ext");
    std::fs::write(&extensions, "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")?;
    openssl(|c| {
        c.args(["x509", "-req", "-days", DAYS, "-CAcreateserial"]).arg("-in").arg(&csr);
        c.arg("-CA").arg(&certs.ca).arg("-CAkey").arg(path("ca.key"));
        c.arg("-extfile").arg(&extensions).arg("-out").arg(&certs.server_cert)
    })?;
    Ok(certs)
}

const NEW_KEY: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];
/// Long enough for any test run, the drill included.
const DAYS: &str = "30";

fn self_signed_ca(key: &Path, cert: &Path, name: &str) -> anyhow::Result<()> {
    openssl(|c| {
        c.args(["req", "-x509", "-nodes", "-days", DAYS]).args(NEW_KEY).arg("-keyout").arg(key).arg("-out").arg(cert);
        // Stated explicitly rather than left to the system's openssl.cnf,
        // which may not mark the certificate as a CA.
        c.args(["-subj", &format!("/CN={name}")]);
        c.args(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
    })
}

fn openssl(args: impl FnOnce(&mut Command) -> &mut Command) -> anyhow::Result<()> {
    let mut command = Command::new("openssl");
    args(&mut command);
    let output = command.output().context("running openssl (is the openssl CLI installed?)")?;
    anyhow::ensure!(
        output.status.success(),
        "openssl {:?} failed with {}: {}",
        command.get_args().collect::<Vec<_>>(),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    /// The server certificate chains to the CA, not to the untrusted one,
    /// and names both loopback spellings.
    #[test]
    fn the_server_certificate_chains_to_the_ca_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = super::generate(dir.path()).expect("generating certificates");
        let verify = |ca: &std::path::Path| {
            Command::new("openssl").arg("verify").arg("-CAfile").arg(ca).arg(&certs.server_cert).output().expect("openssl verify")
        };
        assert!(verify(&certs.ca).status.success());
        assert!(!verify(&certs.untrusted_ca).status.success());
        let text = Command::new("openssl").args(["x509", "-noout", "-text", "-in"]).arg(&certs.server_cert).output().expect("openssl x509");
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("DNS:localhost, IP Address:127.0.0.1"), "{text}");
        let key = std::fs::read_to_string(&certs.server_key).expect("reading the key");
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"), "not PKCS#8: {key}");
    }
}
