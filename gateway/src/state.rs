//! State shared by the public and admin listeners of one gateway instance (behind an `Arc`).

use crate::auto::UpstreamWindow;
use crate::config::GatewayConfig;
use crate::draw::Receipts;
use crate::limits::Limits;
use crate::live::Live;
use crate::metrics::Metrics;
use crate::pages::Pages;
use crate::pow::Pow;
use crate::upstream::Upstreams;
use shared::identity::IdentityVerifier;
use shared::token::AdmissionTokens;
use std::sync::Arc;

pub struct Shared {
    pub config: GatewayConfig,
    /// Mints admission tokens (and verifies them off the hot path).
    pub tokens: AdmissionTokens,
    /// Verifies admission tokens on every proxied request.
    pub fast_tokens: crate::fasttoken::FastVerifier,
    pub identity: IdentityVerifier,
    /// Login tokens this instance has verified (repeat polls skip the signature check).
    pub identities: crate::idcache::IdentityCache,
    pub live: Arc<Live>,
    pub limits: Arc<Limits>,
    pub metrics: Arc<Metrics>,
    pub upstreams: Arc<Upstreams>,
    pub window: Arc<UpstreamWindow>,
    pub pages: Pages,
    pub receipts: Receipts,
    pub pow: Pow,
    /// Draw and readiness answers, reused for a second (`answers.rs`).
    pub answers: crate::answers::Answers,
    pub dev_login: bool,
    /// Whose `X-Forwarded-For` is believed for per-IP limits.
    pub trusted_proxies: crate::clientip::TrustedProxies,
    /// Unique per process start; names this instance in leases and stats.
    pub instance: String,
}
