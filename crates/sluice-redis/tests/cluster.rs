//! The Redis store on a 3-master Redis Cluster: the shared backend suite, and requests whose
//! checks fall in different slots.

mod harness;

use harness::cluster_backend;

sluice_core::backend_suite!(cluster_backend());
