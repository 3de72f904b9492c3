//! The shared override log on Redis, standalone and on a 3-master Cluster: every change raises
//! the version, a snapshot reads the entries and the version together, and concurrent changes
//! from several instances are totally ordered, so that all of them read the same last state.

use futures_util::future::join_all;
use sluice_core::{SharedOverrides, Store};
use sluice_redis::RedisStore;
use sluice_redis::testing::{shared_cluster, shared_server, test_options};

/// `count` stores on one Redis (or the Cluster) under one prefix, as many instances sharing it.
async fn stores(cluster: bool, count: usize) -> Vec<RedisStore> {
    let url = if cluster {
        shared_cluster().url()
    } else {
        shared_server().url()
    };
    let options = test_options();
    let mut stores = Vec::new();
    for _ in 0..count {
        stores.push(RedisStore::connect(&url, options.clone()).await.unwrap());
    }
    stores
}

async fn changes_are_versioned_and_read_back_whole(cluster: bool) {
    let [a, b] = <[RedisStore; 2]>::try_from(stores(cluster, 2).await).unwrap();
    assert!(a.shares_overrides());
    assert_eq!(a.override_version().await.unwrap(), 0);
    assert_eq!(
        Store::overrides(&a).await.unwrap(),
        SharedOverrides::default()
    );
    assert_eq!(a.put_override("one", "{\"n\":1}").await.unwrap(), 1);
    assert_eq!(b.put_override("two", "{\"n\":2}").await.unwrap(), 2);
    assert_eq!(a.put_override("one", "{\"n\":3}").await.unwrap(), 3);
    assert_eq!(b.override_version().await.unwrap(), 3);
    let mut read = Store::overrides(&b).await.unwrap();
    read.entries.sort();
    assert_eq!(
        read,
        SharedOverrides {
            version: 3,
            entries: vec![
                ("one".into(), "{\"n\":3}".into()),
                ("two".into(), "{\"n\":2}".into())
            ],
        }
    );
    assert_eq!(a.remove_override("two").await.unwrap(), 4);
    // Removing what is not there is a change too: the version names every state.
    assert_eq!(a.remove_override("two").await.unwrap(), 5);
    let read = Store::overrides(&a).await.unwrap();
    assert_eq!(read.version, 5);
    assert_eq!(read.entries, vec![("one".into(), "{\"n\":3}".into())]);
}

#[tokio::test]
async fn changes_are_versioned_and_read_back_whole_on_standalone() {
    changes_are_versioned_and_read_back_whole(false).await;
}

#[tokio::test]
async fn changes_are_versioned_and_read_back_whole_on_a_cluster() {
    changes_are_versioned_and_read_back_whole(true).await;
}

async fn concurrent_puts_are_totally_ordered(cluster: bool) {
    let stores = stores(cluster, 3).await;
    let puts = (0..30).map(|i| {
        let store = &stores[i % 3];
        async move { (store.put_override("same", &i.to_string()).await.unwrap(), i) }
    });
    let mut done = join_all(puts).await;
    done.sort();
    let versions: Vec<u64> = done.iter().map(|(v, _)| *v).collect();
    assert_eq!(versions, (1..=30).collect::<Vec<u64>>());
    // The put with the highest version is the one every instance reads.
    let last = done.last().unwrap().1.to_string();
    for store in &stores {
        let read = Store::overrides(store).await.unwrap();
        assert_eq!(read.version, 30);
        assert_eq!(read.entries, vec![("same".to_owned(), last.clone())]);
    }
}

#[tokio::test]
async fn concurrent_puts_are_totally_ordered_on_standalone() {
    concurrent_puts_are_totally_ordered(false).await;
}

#[tokio::test]
async fn concurrent_puts_are_totally_ordered_on_a_cluster() {
    concurrent_puts_are_totally_ordered(true).await;
}
