//! The gateway binary: read config, set up telemetry, run. Everything else is in the library.

use gateway::Gateway;
use gateway::config::GatewayConfig;

// mimalloc: pingora allocates per request (buffers, header copies); glibc malloc showed up
// at ~17 % of samples in the proxy benchmark (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    // A refused config is one line on stderr and exit status 2 (secrets fail closed).
    let config: GatewayConfig = shared::config::load_or_exit();
    shared::telemetry::init(&config.log);
    // Not async on purpose: pingora builds its own runtimes (and may fork).
    Gateway::build(config)?.run()
}
