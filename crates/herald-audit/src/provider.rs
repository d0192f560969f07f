//! The notification provider's side: effects per idempotency key, from the
//! reference receiver's `GET /effects/by-key`.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::AuditError;

#[derive(Debug, Deserialize)]
struct KeyEffects {
    key: Option<String>,
    effects: i64,
}

/// Effects per key at the provider at `url`; effects without a key under "".
pub async fn effects_by_key(url: &str) -> Result<BTreeMap<String, i64>, AuditError> {
    let err = |e: reqwest::Error| AuditError::Provider(format!("{url}: {e}"));
    let rows: Vec<KeyEffects> = reqwest::get(format!("{}/effects/by-key", url.trim_end_matches('/')))
        .await
        .map_err(err)?
        .error_for_status()
        .map_err(err)?
        .json()
        .await
        .map_err(err)?;
    let mut effects = BTreeMap::new();
    for row in rows {
        *effects.entry(row.key.unwrap_or_default()).or_default() += row.effects;
    }
    Ok(effects)
}
