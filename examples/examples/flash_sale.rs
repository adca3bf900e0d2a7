//! A flash sale: 200 shoppers in 4 processes race for 100 items. The purchase reads the stock,
//! awaits something (a payment check), then writes the stock back: a read-modify-write that
//! oversells without a lock. The same code under `#[distributed_lock]` never does.
//!
//! `cargo run --release -p lock-examples --example flash_sale`. Without
//! `LOCK_REDIS_URL`/`REDIS_URL` it starts a throwaway redis-server. It runs the sale twice on
//! fresh stock, once without the lock and once with it, prints how many items were sold each
//! time, and exits non-zero if the locked sale sold more (or fewer) items than it had.

use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, LockError};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

const STOCK: i64 = 100;
const PROCESSES: u32 = 4;
const SHOPPERS_PER_PROCESS: u32 = 50;
/// Between reading and writing the stock: the payment check that makes the race visible.
const PAYMENT_CHECK: Duration = Duration::from_millis(2);

#[derive(Debug, thiserror::Error)]
enum SaleError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

fn stock_key(sku: &str) -> String {
    format!("stock:{sku}")
}

fn sold_key(sku: &str) -> String {
    format!("sold:{sku}")
}

/// One purchase, as naive code writes it: read the stock, check the payment, write the stock
/// back one lower. Two shoppers who read the same stock both sell the same item.
async fn buy(mut con: MultiplexedConnection, sku: &str) -> Result<bool, SaleError> {
    let stock: i64 = con.get(stock_key(sku)).await?;
    if stock <= 0 {
        return Ok(false);
    }
    tokio::time::sleep(PAYMENT_CHECK).await;
    let () = con.set(stock_key(sku), stock - 1).await?;
    // The only atomic step: counts what was really handed out.
    let _: i64 = con.incr(sold_key(sku), 1).await?;
    Ok(true)
}

/// The same purchase under a lock per item: the whole integration is the attribute.
#[distributed_lock(key = "stock:<sku>", ttl = "5s", wait = "60s")]
async fn buy_locked(con: MultiplexedConnection, sku: &str) -> Result<bool, SaleError> {
    buy(con, sku).await
}

/// A buyer process: connects, says READY, waits for the sale to open (a line on stdin), then
/// lets its shoppers loose and prints how many got an item.
async fn buyer(url: &str, sku: &str, locked: bool) -> Result<(), SaleError> {
    let con = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let _open = lock_examples::ready_and_wait_for_start();
    let shoppers: Vec<_> = (0..SHOPPERS_PER_PROCESS)
        .map(|_| {
            let con = con.clone();
            let sku = sku.to_owned();
            tokio::spawn(async move {
                if locked {
                    buy_locked(con, &sku).await
                } else {
                    buy(con, &sku).await
                }
            })
        })
        .collect();
    let mut bought = 0;
    for shopper in shoppers {
        if shopper.await.expect("shopper task")? {
            bought += 1;
        }
    }
    println!("BOUGHT {bought}");
    Ok(())
}

struct Outcome {
    sold: i64,
    stock_left: i64,
    turned_away: u32,
    took: Duration,
}

/// Runs one sale of `STOCK` items in `PROCESSES` buyer processes.
fn sale(url: &str, sku: &str, locked: bool) -> Outcome {
    let mut con = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connect to redis");
    let () = redis::cmd("SET")
        .arg(stock_key(sku))
        .arg(STOCK)
        .query(&mut con)
        .expect("stock the item");
    let locked_flag = if locked { "1" } else { "0" };
    // Every process connected before the sale opens, so they all race from the first moment.
    let mut buyers = lock_examples::start_copies(
        (0..PROCESSES)
            .map(|_| {
                vec![
                    ("FLASH_SALE_SKU", sku.to_owned()),
                    ("FLASH_SALE_LOCKED", locked_flag.to_owned()),
                    ("LOCK_REDIS_URL", url.to_owned()),
                ]
            })
            .collect(),
    );
    let opened = Instant::now();
    lock_examples::start_all(&mut buyers, "open");
    let bought: u32 = lock_examples::finish_copies(buyers)
        .iter()
        .filter_map(|line| line.strip_prefix("BOUGHT "))
        .map(|n| n.parse::<u32>().expect("a count"))
        .sum();
    let took = opened.elapsed();
    let (stock_left, sold): (i64, i64) = redis::pipe()
        .get(stock_key(sku))
        .get(sold_key(sku))
        .query(&mut con)
        .expect("read the outcome");
    assert_eq!(sold, i64::from(bought), "every sale is counted once");
    let () = redis::cmd("DEL")
        .arg(stock_key(sku))
        .arg(sold_key(sku))
        .query(&mut con)
        .expect("clean up");
    Outcome {
        sold,
        stock_left,
        turned_away: PROCESSES * SHOPPERS_PER_PROCESS - bought,
        took,
    }
}

#[tokio::main]
async fn main() {
    if let Ok(sku) = std::env::var("FLASH_SALE_SKU") {
        let url = std::env::var("LOCK_REDIS_URL").expect("set by the parent");
        let locked = std::env::var("FLASH_SALE_LOCKED").as_deref() == Ok("1");
        if let Err(e) = buyer(&url, &sku, locked).await {
            eprintln!("buyer {}: {e}", std::process::id());
            std::process::exit(1);
        }
        return;
    }

    let (_server, url) = lock_examples::redis_url();
    let run = std::process::id();
    println!(
        "flash sale: {STOCK} items, {} shoppers in {PROCESSES} processes; each purchase reads \
         the stock, awaits a {} ms payment check, then writes the stock back\n",
        PROCESSES * SHOPPERS_PER_PROCESS,
        PAYMENT_CHECK.as_millis()
    );
    // Blocking work (child processes, a sync connection): keep it off the async workers.
    let unlocked = {
        let url = url.clone();
        tokio::task::spawn_blocking(move || sale(&url, &format!("{run}-unlocked"), false))
    }
    .await
    .unwrap();
    let locked = tokio::task::spawn_blocking(move || sale(&url, &format!("{run}-locked"), true))
        .await
        .unwrap();

    for (label, o) in [
        ("without the lock:", &unlocked),
        ("with the lock:", &locked),
    ] {
        let verdict = if o.sold > STOCK {
            format!("OVERSOLD by {}", o.sold - STOCK)
        } else {
            "not oversold".to_owned()
        };
        println!(
            "{label:<17} sold {:>3} of {STOCK} -> {verdict:<15} ({} shoppers turned away, stock \
             key reads {}, {:.2} s)",
            o.sold,
            o.turned_away,
            o.stock_left,
            o.took.as_secs_f64()
        );
    }

    if unlocked.sold <= STOCK {
        // The race depends on scheduling; on an idle machine it shows nearly every time.
        println!("\n(the unlocked sale happened not to oversell this time; run it again)");
    }
    if locked.sold != STOCK || locked.stock_left != 0 {
        println!(
            "\nCHECK FAILED: with the lock exactly {STOCK} items must be sold and none left; \
             sold {}, {} left",
            locked.sold, locked.stock_left
        );
        std::process::exit(1);
    }
    println!(
        "\nwith #[distributed_lock(key = \"stock:<sku>\")] on the same read-modify-write: \
         exactly {STOCK} sold, never more."
    );
}
