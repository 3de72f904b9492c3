//! Certificates for tests of TLS: a certificate authority made on the spot, and certificates
//! it signs, all as PEM text.

/// A certificate authority for one test.
pub struct Authority {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    /// The authority's certificate, which clients and servers are told to trust.
    pub pem: String,
}

impl Authority {
    /// A fresh self-signed authority.
    pub fn new() -> Self {
        let key = rcgen::KeyPair::generate().expect("a key pair");
        let mut params =
            rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let pem = params.self_signed(&key).expect("a CA certificate").pem();
        Authority { params, key, pem }
    }

    /// A certificate for `name` signed by this authority: (certificate PEM, key PEM).
    pub fn sign(&self, name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("a key pair");
        let params =
            rcgen::CertificateParams::new(vec![name.to_owned()]).expect("certificate parameters");
        let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
        let cert = params
            .signed_by(&key, &issuer)
            .expect("a signed certificate");
        (cert.pem(), key.serialize_pem())
    }
}

impl Default for Authority {
    fn default() -> Self {
        Self::new()
    }
}

/// A gRPC channel to `addr` over TLS, trusting `ca_pem` and expecting the server's certificate
/// to name `server_name`, presenting `identity` (certificate PEM, key PEM) when given.
pub async fn channel(
    addr: &str,
    ca_pem: &str,
    server_name: &str,
    identity: Option<&(String, String)>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name(server_name);
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://{addr}"))
        .expect("an address")
        .tls_config(tls)?
        .connect()
        .await
}
