//! The Redis store on one `redis-server`: the shared backend suite, and what only a shared
//! store can show.

mod harness;

use harness::standalone_backend;

sluice_core::backend_suite!(standalone_backend());
