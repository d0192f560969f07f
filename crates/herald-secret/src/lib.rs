//! Values an operator gives Herald that must never be shown: passwords,
//! API tokens, and URLs that carry a password.
//!
//! Configuration holds them in these types from the moment it is parsed, so
//! a `{:?}` of a config struct, a `tracing` field or an error text built
//! from them shows `***` instead of the secret. The raw value leaves only
//! through [`Secret::expose`] / [`SecretUrl::expose`], at the one call that
//! hands it to a driver. The storage is `secrecy`'s, which also wipes the
//! value from memory when it is dropped.

use std::fmt;
use std::str::FromStr;

use secrecy::{ExposeSecret, SecretString};

/// What a secret looks like wherever it is shown.
pub const REDACTED: &str = "***";

/// A password or token.
#[derive(Clone)]
pub struct Secret(SecretString);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(SecretString::from(value.into()))
    }

    /// The raw value, for the driver or the comparison that needs it.
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        self.expose() == other.expose()
    }
}

impl Eq for Secret {}

impl FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(value: &str) -> Result<Secret, Self::Err> {
        Ok(Secret::new(value))
    }
}

/// A connection URL (`postgres://user:password@host/db?…`) whose password,
/// and any query parameter that holds one, is shown as `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl {
    raw: Secret,
    shown: String,
}

impl SecretUrl {
    pub fn new(raw: impl Into<String>) -> SecretUrl {
        let raw = raw.into();
        let shown = redact_url(&raw);
        SecretUrl { raw: Secret::new(raw), shown }
    }

    /// The URL with its password, for the driver.
    pub fn expose(&self) -> &str {
        self.raw.expose()
    }

    /// The URL as it may be logged or shown.
    pub fn redacted(&self) -> &str {
        &self.shown
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretUrl({:?})", self.shown)
    }
}

impl FromStr for SecretUrl {
    type Err = std::convert::Infallible;

    fn from_str(value: &str) -> Result<SecretUrl, Self::Err> {
        Ok(SecretUrl::new(value))
    }
}

/// True for a setting whose value is a secret wherever the key comes from:
/// a librdkafka property (`sasl.password`, `ssl.key.password`,
/// `ssl.key.pem`, `sasl.oauthbearer.client.secret`, `sasl.jaas.config`) or
/// a URL query parameter (`password`, `sslpassword`).
pub fn is_sensitive_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["password", "secret", "token", "jaas", "key.pem", "oauthbearer.config"].iter().any(|part| key.contains(part))
}

/// `raw` with the user's password and every sensitive query parameter
/// replaced. Text that is not a `scheme://…` URL cannot be redacted
/// selectively, so only its scheme (if any) is kept.
fn redact_url(raw: &str) -> String {
    let parsed = if raw.contains("://") { url::Url::parse(raw).ok() } else { None };
    let Some(mut url) = parsed else {
        return match raw.split_once("://") {
            Some((scheme, _)) => format!("{scheme}://{REDACTED}"),
            None => REDACTED.to_owned(),
        };
    };
    if url.password().is_some() {
        // Fails only for URLs that cannot have a password (no host); those
        // had none to begin with.
        let _ = url.set_password(Some(REDACTED));
    }
    if url.query_pairs().any(|(key, _)| is_sensitive_key(&key)) {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(key, value)| {
                let value = if is_sensitive_key(&key) { REDACTED.to_owned() } else { value.into_owned() };
                (key.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_shows_nowhere() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret} {secret:?} {:?}", Some(&secret)), "*** *** Some(***)");
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn a_url_shows_without_its_password() {
        let url = SecretUrl::new("postgres://herald:hunter2@db.example:5432/herald?sslmode=verify-full&sslpassword=p4ss");
        let shown = format!("{url} {url:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("p4ss"), "{shown}");
        assert!(shown.contains("postgres://herald:***@db.example:5432/herald?sslmode=verify-full&sslpassword=***"), "{shown}");
        assert_eq!(url.expose(), "postgres://herald:hunter2@db.example:5432/herald?sslmode=verify-full&sslpassword=p4ss");
    }

    #[test]
    fn a_url_without_a_password_shows_whole() {
        let url = SecretUrl::new("sqlite:///var/lib/herald/herald.sqlite?mode=rwc");
        assert_eq!(url.to_string(), "sqlite:///var/lib/herald/herald.sqlite?mode=rwc");
    }

    #[test]
    fn text_that_is_no_url_is_hidden_whole() {
        assert_eq!(SecretUrl::new("postgres://u:pw@[bad").to_string(), "postgres://***");
        assert_eq!(SecretUrl::new("u:pw").to_string(), "***");
    }

    #[test]
    fn sensitive_keys() {
        for key in ["sasl.password", "ssl.key.password", "ssl.key.pem", "sasl.oauthbearer.client.secret", "sasl.jaas.config", "sslpassword"]
        {
            assert!(is_sensitive_key(key), "{key}");
        }
        for key in ["security.protocol", "sasl.username", "ssl.ca.location", "sslmode"] {
            assert!(!is_sensitive_key(key), "{key}");
        }
    }
}
