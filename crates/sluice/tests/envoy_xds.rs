//! Rules over xDS, as Envoy Gateway serves them: the binary started as `ratelimit` with
//! `CONFIG_TYPE=GRPC_XDS_SOTW` subscribes to `RateLimitConfig` resources on a real gRPC xDS
//! server run by this test, ACKs a set it can load and enforces it, NACKs a bad one with the
//! reason while the old rules stay, and after the stream drops connects again asking with the
//! last version it accepted.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor as RequestDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::Message as _;
use sluice_test_support::window::LatestWindow;
use sluice_test_support::{
    Listener, ServeBuilder, ServeProcess, eventually_within, free_addr, listening,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

const TYPE: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";
/// How long any one step may take before the test fails: far beyond a healthy machine's need.
const STEP: Duration = Duration::from_secs(30);

/// One subscription the server accepted: the client's requests, and where to send responses.
type Stream = (
    Streaming<DiscoveryRequest>,
    mpsc::Sender<Result<DiscoveryResponse, Status>>,
);

/// An xDS server that hands every new stream to the test.
struct Server {
    streams: mpsc::UnboundedSender<Stream>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Server {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let _ = self.streams.send((request.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

fn config(domain: &str, unit: RateLimitUnit, limit: u32) -> Any {
    let config = RateLimitConfig {
        name: format!("{domain}-config"),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: "generic_key".into(),
            value: "slow".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: limit,
                ..Default::default()
            }),
            ..Default::default()
        }],
    };
    Any {
        type_url: TYPE.into(),
        value: config.encode_to_vec(),
    }
}

fn response(version: &str, nonce: &str, resources: Vec<Any>) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: version.into(),
        resources,
        type_url: TYPE.into(),
        nonce: nonce.into(),
        ..Default::default()
    }
}

async fn next<T>(what: &str, f: impl std::future::Future<Output = Option<T>>) -> T {
    tokio::time::timeout(STEP, f)
        .await
        .unwrap_or_else(|_| panic!("no {what} within {STEP:?}"))
        .unwrap_or_else(|| panic!("the {what} stream ended"))
}

async fn request_of(stream: &mut Streaming<DiscoveryRequest>) -> DiscoveryRequest {
    next("request", async { stream.message().await.unwrap() }).await
}

/// The answer to one check of `generic_key=slow` in `domain`.
async fn check(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    domain: &str,
) -> RateLimitResponse {
    let request = RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RequestDescriptor {
            entries: vec![Entry {
                key: "generic_key".into(),
                value: "slow".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
}

/// The overall code of one check of `generic_key=slow` in `domain`.
async fn code(client: &mut RateLimitServiceClient<tonic::transport::Channel>, domain: &str) -> i32 {
    check(client, domain).await.overall_code
}

/// The limits here are Envoy's `unit: DAY`, whose windows are aligned to the clock: a day can end
/// between two checks (at midnight UTC). Checks `domain`'s counter until `day` holds `n` answers
/// of one day, and returns their overall codes, to be held to what one day answers.
async fn codes_in_one_day(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    domain: &str,
    day: &mut LatestWindow<i32>,
    n: usize,
) -> Vec<i32> {
    while day.len() < n {
        let r = check(client, domain).await;
        let until = r.statuses[0]
            .duration_until_reset
            .expect("a reset for a limited descriptor");
        let until = Duration::new(
            u64::try_from(until.seconds).unwrap(),
            u32::try_from(until.nanos).unwrap(),
        );
        day.push(r.overall_code, until);
    }
    day.answers().to_vec()
}

/// An xDS server on loopback handing its streams to the test.
async fn xds_server() -> (std::net::SocketAddr, mpsc::UnboundedReceiver<Stream>) {
    xds_server_with(None).await
}

/// [`xds_server`], over `tls` when given.
async fn xds_server_with(
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> (std::net::SocketAddr, mpsc::UnboundedReceiver<Stream>) {
    let (streams_tx, streams) = mpsc::unbounded_channel();
    let xds = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let xds_addr = xds.local_addr().unwrap();
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).unwrap();
    }
    tokio::spawn(
        builder
            .add_service(AggregatedDiscoveryServiceServer::new(Server {
                streams: streams_tx,
            }))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(xds)),
    );
    (xds_addr, streams)
}

/// The binary as `ratelimit` following `xds_addr`, with `extra` variables, ready to start; the
/// directory of its link must outlive it.
fn ratelimit(
    xds_addr: std::net::SocketAddr,
    extra: &[(&str, &str)],
) -> (tempfile::TempDir, ServeBuilder) {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &program).unwrap();
    let debug = free_addr();
    let port = |a: &str| a.rsplit_once(':').unwrap().1.to_owned();
    let builder = ServeProcess::ratelimit(&program)
        .envs([
            ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_owned()),
            ("CONFIG_GRPC_XDS_SERVER_URL", xds_addr.to_string()),
            ("CONFIG_GRPC_XDS_NODE_ID", "sluice-test-node".to_owned()),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "50ms".to_owned()),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "200ms".to_owned()),
            ("SLUICE_STORE", "memory".to_owned()),
            ("USE_STATSD", "false".to_owned()),
            ("DEBUG_HOST", "127.0.0.1".to_owned()),
            ("DEBUG_PORT", port(&debug)),
        ])
        .envs(extra.iter().copied());
    (dir, builder)
}

async fn health(http: &str) -> u16 {
    reqwest::get(format!("http://{http}/healthcheck"))
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// By default, as envoyproxy/ratelimit, the service serves only once the first rules are in
/// force: a refused first set is not enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_force_start_it_serves_once_the_first_rules_load() {
    let (xds_addr, mut streams) = xds_server().await;
    let (_dir, ratelimit) = ratelimit(xds_addr, &[]);
    let process = ratelimit.spawn();
    let grpc = process.grpc();
    let (mut requests, responses) = next("stream", streams.recv()).await;
    request_of(&mut requests).await;
    let bad = vec![config("eg", RateLimitUnit::Unknown, 1)];
    responses.send(Ok(response("1", "n1", bad))).await.unwrap();
    let nack = request_of(&mut requests).await;
    assert!(nack.error_detail.is_some());
    // Subscribed and answered, yet not serving.
    assert!(!listening(grpc));
    let good = vec![config("eg", RateLimitUnit::Day, 1)];
    responses.send(Ok(response("2", "n2", good))).await.unwrap();
    assert_eq!(request_of(&mut requests).await.version_info, "2");
    eventually_within("it serves once the rules loaded", STEP, || {
        std::future::ready(listening(grpc))
    })
    .await;
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let mut day = LatestWindow::new();
    assert_eq!(
        codes_in_one_day(&mut client, "eg", &mut day, 2).await,
        [Code::Ok as i32, Code::OverLimit as i32]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_arrive_over_xds_are_acked_nacked_and_followed_across_reconnects() {
    let (xds_addr, mut streams) = xds_server().await;
    let (_dir, ratelimit) = ratelimit(
        xds_addr,
        &[
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ],
    );
    let process = ratelimit.ready_on(Listener::Grpc).start();
    let (http, grpc) = (process.http().to_owned(), process.grpc().to_owned());
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();

    // The subscription: this node, this type, no version yet.
    let (mut requests, responses) = next("stream", streams.recv()).await;
    let first = request_of(&mut requests).await;
    assert_eq!(first.node.unwrap().id, "sluice-test-node");
    assert_eq!(first.type_url, TYPE);
    assert_eq!(first.version_info, "");
    // Forced to start before any rules arrive: nothing is limited, and the health check fails.
    assert_eq!(code(&mut client, "eg").await, Code::Ok as i32);
    assert_eq!(health(&http).await, 500);

    // Version 1: two a day. ACKed, then enforced.
    let one = vec![config("eg", RateLimitUnit::Day, 2)];
    responses.send(Ok(response("1", "n1", one))).await.unwrap();
    let ack = request_of(&mut requests).await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("1", "n1")
    );
    assert!(ack.error_detail.is_none(), "{ack:?}");
    let mut eg = LatestWindow::new();
    assert_eq!(
        codes_in_one_day(&mut client, "eg", &mut eg, 3).await,
        [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]
    );

    // Version 2 is bad (a unit that is no unit): NACKed with the reason, version 1 stays.
    let bad = vec![
        config("other", RateLimitUnit::Day, 1),
        config("eg", RateLimitUnit::Unknown, 100),
    ];
    responses.send(Ok(response("2", "n2", bad))).await.unwrap();
    let nack = request_of(&mut requests).await;
    assert_eq!(
        (nack.version_info.as_str(), nack.response_nonce.as_str()),
        ("1", "n2")
    );
    let reason = nack
        .error_detail
        .expect("a NACK carries the reason")
        .message;
    assert!(
        reason.contains("xds:eg-config") && reason.contains("unit"),
        "{reason}"
    );
    // Version 1's two a day still hold: a fourth check in the day is refused.
    assert_eq!(
        codes_in_one_day(&mut client, "eg", &mut eg, 4).await,
        [
            Code::Ok as i32,
            Code::Ok as i32,
            Code::OverLimit as i32,
            Code::OverLimit as i32
        ]
    );
    assert_eq!(code(&mut client, "other").await, Code::Ok as i32);
    assert_eq!(code(&mut client, "other").await, Code::Ok as i32);

    // The stream drops; the client comes back asking with the version it accepted.
    drop(responses);
    drop(requests);
    let (mut requests, responses) = next("second stream", streams.recv()).await;
    let again = request_of(&mut requests).await;
    assert_eq!(again.version_info, "1");
    assert_eq!(again.node.unwrap().id, "sluice-test-node");

    // Version 3 on the new stream: the other domain, one a day.
    let three = vec![
        config("eg", RateLimitUnit::Day, 2),
        config("other", RateLimitUnit::Day, 1),
    ];
    responses
        .send(Ok(response("3", "n3", three)))
        .await
        .unwrap();
    let ack = request_of(&mut requests).await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("3", "n3")
    );
    let mut other = LatestWindow::new();
    assert_eq!(
        codes_in_one_day(&mut client, "other", &mut other, 2).await,
        [Code::Ok as i32, Code::OverLimit as i32]
    );
}

/// Envoy Gateway's contract whole: the binary as `ratelimit` takes its rules from an xDS server
/// over mutual TLS (checking the server's name), serves gRPC with mutual TLS, and answers
/// `/healthcheck` once the rules are in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_contract_xds_and_grpc_over_mutual_tls() {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let ca = sluice_testing::tls::Authority::new();
    let (xds_cert, xds_key) = ca.sign("envoy-gateway");
    let to_xds = ca.sign("envoy-ratelimit");
    let served = ca.sign("localhost");
    let envoy = ca.sign("envoy");
    let certs = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = certs.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let ca_file = write("ca.pem", &ca.pem);
    let files = [
        write("xds-client.pem", &to_xds.0),
        write("xds-client.key", &to_xds.1),
        write("server.pem", &served.0),
        write("server.key", &served.1),
    ];
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&xds_cert, &xds_key))
        .client_ca_root(Certificate::from_pem(&ca.pem));
    let (xds_addr, mut streams) = xds_server_with(Some(tls)).await;
    let (_dir, ratelimit) = ratelimit(
        xds_addr,
        &[
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", &ca_file),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", &files[0]),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", &files[1]),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "envoy-gateway"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", &files[2]),
            ("GRPC_SERVER_TLS_KEY", &files[3]),
            ("GRPC_CLIENT_TLS_CACERT", &ca_file),
        ],
    );
    let process = ratelimit.spawn();
    let (http, grpc) = (process.http().to_owned(), process.grpc().to_owned());

    // The subscription arrives over mutual TLS: the server asked for a client certificate.
    let (mut requests, responses) = next("stream over TLS", streams.recv()).await;
    assert_eq!(request_of(&mut requests).await.type_url, TYPE);
    let rules = vec![config("eg", RateLimitUnit::Day, 1)];
    responses
        .send(Ok(response("1", "n1", rules)))
        .await
        .unwrap();
    assert_eq!(request_of(&mut requests).await.version_info, "1");

    let channel = eventually_within("gRPC over TLS serves", STEP, || {
        sluice_testing::tls::channel(&grpc, &ca.pem, "localhost", Some(&envoy))
    })
    .await;
    let mut client = RateLimitServiceClient::new(channel);
    let mut day = LatestWindow::new();
    assert_eq!(
        codes_in_one_day(&mut client, "eg", &mut day, 2).await,
        [Code::Ok as i32, Code::OverLimit as i32]
    );
    assert_eq!(health(&http).await, 200);

    // Envoy without a client certificate is refused in the handshake.
    let refused = match sluice_testing::tls::channel(&grpc, &ca.pem, "localhost", None).await {
        Err(_) => true,
        Ok(channel) => RateLimitServiceClient::new(channel)
            .should_rate_limit(RateLimitRequest {
                domain: "eg".into(),
                ..Default::default()
            })
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate was answered");
}
