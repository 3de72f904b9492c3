//! Rules over xDS, state of the world: what envoyproxy/ratelimit does with
//! `CONFIG_TYPE=GRPC_XDS_SOTW`, and how Envoy Gateway configures it.
//!
//! The client opens an aggregated discovery stream to the xDS server, asks for every
//! `RateLimitConfig` resource (`ratelimit.config.ratelimit.v3`), and on each response turns the
//! whole set into rules: one domain per resource, checked as rule files are (and refused if the
//! store cannot hold them). A set that loads is put in force and ACKed with its version; one that
//! does not is NACKed with the reason in `error_detail`, and the rules in force stay. When the
//! stream ends or cannot be opened, the client connects again after a back-off that doubles from
//! `backoff_initial` up to `backoff_max`, asking again with the last version it accepted.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitUnit,
};
use prost::Message as _;
use serde_json::{Map, json};
use sluice_rules::{LoadError, LoadOptions, ReloadEvent, Reloader, RuleSet};
use tokio::sync::{mpsc, watch};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// The type of the resources asked for.
pub const RATE_LIMIT_CONFIG_TYPE: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Where the rules come from, and how to reach it.
#[derive(Clone)]
pub struct XdsOptions {
    /// The xDS server, as `host:port` or a URL.
    pub server: String,
    /// The node id this instance presents.
    pub node_id: String,
    /// TLS to the server, when set.
    pub tls: Option<XdsTls>,
    /// The first wait before connecting again.
    pub backoff_initial: Duration,
    /// The longest wait before connecting again.
    pub backoff_max: Duration,
    /// Start serving only once the first rule set is in force (envoyproxy/ratelimit's default;
    /// its `FORCE_START_WITHOUT_INITIAL_CONFIG` turns it off).
    pub wait_for_rules: bool,
}

impl std::fmt::Debug for XdsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsOptions")
            .field("server", &self.server)
            .field("node_id", &self.node_id)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// TLS to the xDS server, from PEM files' contents.
#[derive(Clone, Default)]
pub struct XdsTls {
    /// The CA the server's certificate must chain to (the public roots without it).
    pub ca: Option<Vec<u8>>,
    /// This client's certificate and key, for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the server's certificate must hold, when not the host of `server`.
    pub server_name: Option<String>,
}

/// Turns the resources of one response into rules: every resource a `RateLimitConfig`, each
/// its own domain.
pub fn rules_from_resources(resources: &[Any], load: LoadOptions) -> Result<RuleSet, String> {
    let mut sources = Vec::with_capacity(resources.len());
    for (i, any) in resources.iter().enumerate() {
        if any.type_url != RATE_LIMIT_CONFIG_TYPE {
            return Err(format!(
                "resource {i} is a {}, not a RateLimitConfig",
                any.type_url
            ));
        }
        let config = RateLimitConfig::decode(any.value.as_slice())
            .map_err(|e| format!("resource {i} does not decode as a RateLimitConfig: {e}"))?;
        let name = if config.name.is_empty() {
            format!("xds:resource-{i}")
        } else {
            format!("xds:{}", config.name)
        };
        // JSON is YAML: the rules' own decoder checks it, with its own messages.
        sources.push((name, config_json(&config).to_string()));
    }
    RuleSet::from_sources_with(sources.iter().map(|(n, t)| (n.as_str(), t.as_str())), load)
        .map_err(|e: LoadError| e.to_string())
}

/// A `RateLimitConfig` in the rule files' form.
fn config_json(config: &RateLimitConfig) -> serde_json::Value {
    json!({
        "domain": config.domain,
        "descriptors": config.descriptors.iter().map(descriptor_json).collect::<Vec<_>>(),
    })
}

fn descriptor_json(d: &RateLimitDescriptor) -> serde_json::Value {
    let mut out = Map::new();
    out.insert("key".into(), json!(d.key));
    if !d.value.is_empty() {
        out.insert("value".into(), json!(d.value));
    }
    if let Some(limit) = &d.rate_limit {
        let mut rl = Map::new();
        let unit = RateLimitUnit::try_from(limit.unit).unwrap_or(RateLimitUnit::Unknown);
        if unit != RateLimitUnit::Unknown || !limit.unlimited {
            rl.insert(
                "unit".into(),
                json!(unit.as_str_name().to_ascii_lowercase()),
            );
        }
        if limit.unlimited {
            rl.insert("unlimited".into(), json!(true));
        } else {
            rl.insert("requests_per_unit".into(), json!(limit.requests_per_unit));
        }
        if !limit.name.is_empty() {
            rl.insert("name".into(), json!(limit.name));
        }
        if !limit.replaces.is_empty() {
            let replaces: Vec<_> = limit
                .replaces
                .iter()
                .map(|r| json!({ "name": r.name }))
                .collect();
            rl.insert("replaces".into(), json!(replaces));
        }
        out.insert("rate_limit".into(), serde_json::Value::Object(rl));
    }
    if !d.descriptors.is_empty() {
        let children: Vec<_> = d.descriptors.iter().map(descriptor_json).collect();
        out.insert("descriptors".into(), json!(children));
    }
    for (flag, set) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if set {
            out.insert(flag.into(), json!(true));
        }
    }
    if let Some(metadata) = &d.metadata {
        out.insert("metadata".into(), crate::metadata::struct_json(metadata));
    }
    serde_json::Value::Object(out)
}

/// Follows the xDS server until `stopped` turns true, installing each set of rules it sends.
pub async fn follow(
    options: XdsOptions,
    reloader: Arc<Reloader>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut accepted = String::new();
    let mut backoff = options.backoff_initial;
    loop {
        let session = session(&options, &reloader, &mut accepted, &mut backoff);
        let ended = tokio::select! {
            ended = session => ended,
            _ = stopped.wait_for(|s| *s) => return,
        };
        match ended {
            Ok(()) => {
                tracing::warn!(server = %options.server, "xDS stream ended; connecting again")
            }
            Err(e) => {
                tracing::warn!(server = %options.server, error = %e, retry_in = ?backoff, "xDS server unavailable")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = stopped.wait_for(|s| *s) => return,
        }
        backoff = (backoff * 2).min(options.backoff_max);
    }
}

/// One stream: subscribe, then install, ACK and NACK until it ends.
async fn session(
    options: &XdsOptions,
    reloader: &Reloader,
    accepted: &mut String,
    backoff: &mut Duration,
) -> Result<(), String> {
    let channel = endpoint(options)?
        .connect()
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let (requests, outgoing) = mpsc::channel::<DiscoveryRequest>(4);
    let node = Node {
        id: options.node_id.clone(),
        ..Default::default()
    };
    let ask = |version: &str, nonce: &str, error: Option<Status>| DiscoveryRequest {
        version_info: version.to_owned(),
        node: Some(node.clone()),
        type_url: RATE_LIMIT_CONFIG_TYPE.to_owned(),
        response_nonce: nonce.to_owned(),
        error_detail: error,
        ..Default::default()
    };
    requests
        .send(ask(accepted, "", None))
        .await
        .map_err(|_| "the request stream closed".to_owned())?;
    let mut responses = client
        .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await
        .map_err(|e| format!("cannot subscribe: {e}"))?
        .into_inner();
    tracing::info!(server = %options.server, node = %options.node_id, "following rules over xDS");
    loop {
        let response: DiscoveryResponse = match responses.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
            Err(e) => return Err(format!("stream failed: {e}")),
        };
        // A stream that delivers counts as healthy: the next failure waits the least again.
        *backoff = options.backoff_initial;
        let reply = match apply(reloader, &response) {
            Ok(()) => {
                accepted.clone_from(&response.version_info);
                ask(&response.version_info, &response.nonce, None)
            }
            Err(reason) => {
                tracing::error!(version = %response.version_info, "xDS rules refused; the rules in force stay:\n{reason}");
                ask(
                    accepted,
                    &response.nonce,
                    Some(Status {
                        code: tonic::Code::InvalidArgument as i32,
                        message: reason,
                        details: Vec::new(),
                    }),
                )
            }
        };
        if requests.send(reply).await.is_err() {
            return Ok(());
        }
    }
}

/// Installs the rules of one response, or says why not.
fn apply(reloader: &Reloader, response: &DiscoveryResponse) -> Result<(), String> {
    if response.type_url != RATE_LIMIT_CONFIG_TYPE {
        return Err(format!(
            "asked for {RATE_LIMIT_CONFIG_TYPE}, got {}",
            response.type_url
        ));
    }
    let rules = rules_from_resources(&response.resources, reloader.load_options())?;
    match reloader.install(Ok(rules)) {
        ReloadEvent::Reloaded { .. } | ReloadEvent::Unchanged => Ok(()),
        ReloadEvent::Failed(e) => Err(e.to_string()),
    }
}

fn endpoint(options: &XdsOptions) -> Result<Endpoint, String> {
    let scheme = if options.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let url = if options.server.contains("://") {
        options.server.clone()
    } else {
        format!("{scheme}://{}", options.server)
    };
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| format!("{url}: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    if let Some(tls) = &options.tls {
        let mut config = ClientTlsConfig::new().with_webpki_roots();
        if let Some(ca) = &tls.ca {
            config = config.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &tls.server_name {
            config = config.domain_name(name.clone());
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| format!("TLS to the xDS server: {e}"))?;
    }
    Ok(endpoint)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::ratelimit::config::ratelimit::v3::{RateLimitPolicy, RateLimitReplace};

    fn any(config: &RateLimitConfig) -> Any {
        Any {
            type_url: RATE_LIMIT_CONFIG_TYPE.to_owned(),
            value: config.encode_to_vec(),
        }
    }

    fn limit(unit: RateLimitUnit, n: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: n,
            ..Default::default()
        })
    }

    #[test]
    fn a_rate_limit_config_becomes_the_rules_a_file_would_give() {
        let config = RateLimitConfig {
            name: "gateway".into(),
            domain: "eg".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "client".into(),
                descriptors: vec![
                    RateLimitDescriptor {
                        key: "path".into(),
                        value: "/api/*".into(),
                        rate_limit: Some(RateLimitPolicy {
                            name: "api".into(),
                            replaces: vec![RateLimitReplace {
                                name: "other".into(),
                            }],
                            ..limit(RateLimitUnit::Hour, 500).unwrap()
                        }),
                        shadow_mode: true,
                        ..Default::default()
                    },
                    RateLimitDescriptor {
                        key: "bot".into(),
                        rate_limit: Some(RateLimitPolicy {
                            unlimited: true,
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
        };
        let from_xds = rules_from_resources(&[any(&config)], LoadOptions::default()).unwrap();
        let from_file = RuleSet::parse(
            "rules.yaml",
            "domain: eg\ndescriptors:\n  - key: client\n    descriptors:\n      - key: path\n        value: /api/*\n        shadow_mode: true\n        rate_limit: {name: api, replaces: [{name: other}], unit: hour, requests_per_unit: 500}\n      - key: bot\n        rate_limit: {unlimited: true}\n",
        )
        .unwrap();
        assert_eq!(
            crate::debug::dump(&from_xds),
            crate::debug::dump(&from_file)
        );
        assert!(!crate::debug::dump(&from_xds).is_empty());
    }

    #[test]
    fn bad_resources_are_refused_with_a_reason() {
        let unknown_unit = RateLimitConfig {
            name: "bad".into(),
            domain: "eg".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                rate_limit: limit(RateLimitUnit::Unknown, 5),
                ..Default::default()
            }],
        };
        let e = rules_from_resources(&[any(&unknown_unit)], LoadOptions::default()).unwrap_err();
        assert!(e.contains("xds:bad"), "{e}");
        let mut ok = unknown_unit.clone();
        ok.descriptors[0].rate_limit = limit(RateLimitUnit::Second, 5);
        let mut ok_again = ok.clone();
        ok_again.name = "again".into();
        let e =
            rules_from_resources(&[any(&ok), any(&ok_again)], LoadOptions::default()).unwrap_err();
        assert!(e.contains("eg"), "{e}");
        let wrong = Any {
            type_url: "type.googleapis.com/google.protobuf.Empty".into(),
            value: Vec::new(),
        };
        let e = rules_from_resources(&[wrong], LoadOptions::default()).unwrap_err();
        assert!(e.contains("not a RateLimitConfig"), "{e}");
        let garbage = Any {
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            value: vec![0xff, 0xff, 0xff],
        };
        assert!(rules_from_resources(&[garbage], LoadOptions::default()).is_err());
    }
}
