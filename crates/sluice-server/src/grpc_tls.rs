//! TLS on the gRPC listener: rustls from the PEM files' contents, mutual when the clients' CA
//! is given, h2 the only protocol offered.

use std::sync::Arc;

/// TLS for the gRPC listener, from PEM files' contents.
#[derive(Clone)]
pub struct GrpcTls {
    /// The server's certificate chain.
    pub cert: Vec<u8>,
    /// The server's private key.
    pub key: Vec<u8>,
    /// The CA that clients' certificates must chain to; with it, a client without a valid
    /// certificate is refused in the handshake (mutual TLS).
    pub client_ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for GrpcTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("GrpcTls")
            .field("mutual", &self.client_ca.is_some())
            .finish_non_exhaustive()
    }
}

/// The gRPC listener's TLS from PEM contents: the server's identity, and the clients' CA when
/// the TLS is mutual; h2 is the only protocol offered. The reason when a file holds no usable
/// certificate or key.
pub(crate) fn acceptor(tls: &GrpcTls) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let certs = CertificateDer::pem_slice_iter(&tls.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the server certificate: {e}"))?;
    if certs.is_empty() {
        return Err("the server certificate file holds no PEM certificate".to_owned());
    }
    let key =
        PrivateKeyDer::from_pem_slice(&tls.key).map_err(|e| format!("the server key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &tls.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                let cert = cert.map_err(|e| format!("the client CA: {e}"))?;
                roots.add(cert).map_err(|e| format!("the client CA: {e}"))?;
            }
            if roots.is_empty() {
                return Err("the client CA file holds no PEM certificate".to_owned());
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| format!("the client CA: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("the server certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(tls: &GrpcTls) -> String {
        match acceptor(tls) {
            Ok(_) => "accepted".to_owned(),
            Err(e) => e,
        }
    }

    #[test]
    fn tls_files_that_cannot_serve_are_refused_with_the_file_they_come_from() {
        let ca = sluice_testing::tls::Authority::new();
        let (cert, key) = ca.sign("localhost");
        let good = GrpcTls {
            cert: cert.clone().into_bytes(),
            key: key.clone().into_bytes(),
            client_ca: Some(ca.pem.clone().into_bytes()),
        };
        assert_eq!(reason(&good), "accepted");
        let one_way = GrpcTls {
            client_ca: None,
            ..good.clone()
        };
        assert_eq!(reason(&one_way), "accepted");

        let no_cert = GrpcTls {
            cert: b"not a certificate".to_vec(),
            ..good.clone()
        };
        assert!(
            reason(&no_cert).contains("server certificate"),
            "{}",
            reason(&no_cert)
        );
        let no_key = GrpcTls {
            key: b"not a key".to_vec(),
            ..good.clone()
        };
        assert!(
            reason(&no_key).contains("server key"),
            "{}",
            reason(&no_key)
        );
        let no_ca = GrpcTls {
            client_ca: Some(b"not a CA".to_vec()),
            ..good.clone()
        };
        assert!(reason(&no_ca).contains("client CA"), "{}", reason(&no_ca));
        // A key that is not the certificate's.
        let (_, other_key) = ca.sign("localhost");
        let mismatched = GrpcTls {
            key: other_key.into_bytes(),
            ..good
        };
        assert!(
            reason(&mismatched).contains("certificate and key"),
            "{}",
            reason(&mismatched)
        );
    }
}
