//! The etcd flags fleet-router and fleetdeck share (`--policy-etcd`, `--policy-key`, auth and TLS files),
//! as one `clap` group each program flattens into its command line, and the connection they describe.

use std::path::PathBuf;

use crate::{Credentials, EtcdConfig, EtcdError, TlsFiles};

/// Where the fleet's policy lives in etcd, and how to reach it.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EtcdArgs {
    /// The fleet's policy lives in etcd: the cluster's client URL(s), comma-separated (with --policy-key).
    /// Routers watch the key (every value validated like an admin PUT); the app writes it in one guarded txn.
    #[arg(long, requires = "policy_key", value_name = "URL")]
    pub policy_etcd: Option<String>,
    /// The etcd key holding the policy spec (YAML or JSON), e.g. /fleetdeck/FLEET/policy.
    #[arg(long, requires = "policy_etcd")]
    pub policy_key: Option<String>,
    /// File holding USER:PASSWORD for etcd's auth (kept in memory only, never logged or stored).
    #[arg(long, requires = "policy_etcd")]
    pub etcd_user_file: Option<PathBuf>,
    /// PEM CA certificate of etcd's https endpoint (fleet-router: needs the `tls` build feature).
    #[arg(long, requires = "policy_etcd")]
    pub etcd_ca: Option<PathBuf>,
    /// PEM client certificate for etcd (with --etcd-key).
    #[arg(long, requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,
    /// PKCS#8 PEM key of --etcd-cert.
    #[arg(long, requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
}

impl EtcdArgs {
    /// The connection and the key, when `--policy-etcd` was given; the credentials file is read here.
    pub fn connection(&self) -> Result<Option<(EtcdConfig, String)>, EtcdError> {
        let (Some(endpoints), Some(key)) = (&self.policy_etcd, &self.policy_key) else {
            return Ok(None);
        };
        let mut etcd = EtcdConfig::new(endpoints);
        if let Some(path) = &self.etcd_user_file {
            etcd.credentials = Some(Credentials::from_file(path)?);
        }
        etcd.tls =
            TlsFiles { ca: self.etcd_ca.clone(), cert: self.etcd_cert.clone(), key: self.etcd_key.clone() };
        Ok(Some((etcd, key.clone())))
    }
}
