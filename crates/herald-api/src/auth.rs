use std::collections::HashMap;

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;

use crate::problem::Problem;

/// Bearer tokens and the caller each one authenticates. Its `Debug` names
/// the callers, never a token.
#[derive(Clone, Default)]
pub struct Tokens {
    callers: HashMap<String, String>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut callers: Vec<&str> = self.callers.values().map(String::as_str).collect();
        callers.sort_unstable();
        f.debug_struct("Tokens").field("callers", &callers).finish_non_exhaustive()
    }
}

impl Tokens {
    /// Parses `token:caller,token:caller` (the `HERALD_API_TOKENS` format).
    pub fn parse(spec: &str) -> Result<Tokens, String> {
        let mut callers = HashMap::new();
        for (index, pair) in spec.split(',').map(str::trim).filter(|p| !p.is_empty()).enumerate() {
            // The entry may be a token with its separator missing: say
            // which one is wrong by position, never by its text.
            let (token, caller) = pair
                .split_once(':')
                .filter(|(t, c)| !t.is_empty() && !c.is_empty())
                .ok_or_else(|| format!("token entry {} is not token:caller", index + 1))?;
            callers.insert(token.to_owned(), caller.to_owned());
        }
        if callers.is_empty() {
            return Err("no API tokens configured".into());
        }
        Ok(Tokens { callers })
    }

    pub fn single(token: &str, caller: &str) -> Tokens {
        Tokens { callers: HashMap::from([(token.to_owned(), caller.to_owned())]) }
    }

    /// The caller behind the request's bearer token, or 401.
    pub fn caller(&self, headers: &HeaderMap) -> Result<String, Problem> {
        let value = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| Problem::unauthorized("missing Authorization: Bearer <token>"))?;
        let token = value.strip_prefix("Bearer ").ok_or_else(|| Problem::unauthorized("Authorization must be `Bearer <token>`"))?;
        self.callers.get(token.trim()).cloned().ok_or_else(|| Problem::unauthorized("unknown token"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pairs_and_rejects_malformed_entries() {
        let tokens = Tokens::parse("t1:alice, t2:bob").unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, "Bearer t2".parse().unwrap());
        assert_eq!(tokens.caller(&headers).unwrap(), "bob");
        assert!(Tokens::parse("t1").is_err());
        assert!(Tokens::parse(":alice").is_err());
        assert!(Tokens::parse("").is_err());
    }

    #[test]
    fn no_token_shows_in_debug_or_errors() {
        let tokens = Tokens::parse("s3cr3t-one:alice,s3cr3t-two:bob").unwrap();
        let shown = format!("{tokens:?}");
        assert!(!shown.contains("s3cr3t") && shown.contains("alice"), "{shown}");
        let error = Tokens::parse("fine:alice,s3cr3t-no-caller").unwrap_err();
        assert!(!error.contains("s3cr3t") && error.contains("entry 2"), "{error}");
    }

    #[test]
    fn unknown_or_missing_token_is_unauthorized() {
        let tokens = Tokens::single("t1", "alice");
        let mut headers = HeaderMap::new();
        assert_eq!(tokens.caller(&headers).unwrap_err().status.as_u16(), 401);
        headers.insert(AUTHORIZATION, "Bearer nope".parse().unwrap());
        assert_eq!(tokens.caller(&headers).unwrap_err().status.as_u16(), 401);
    }
}
