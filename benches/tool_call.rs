//! `workspace:read_file` on a small file: the full Trellis path (grant ->
//! fresh instance -> schema check -> call -> JSON result) against bare
//! wasmtime doing the same call on the same component (InstancePre + pooling,
//! no Trellis code), measured side by side in one run.
//!
//! Besides criterion's report, prints p50/p99 of both from an interleaved
//! sample and their ratio; `BENCHMARKS.md` records these figures.

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use serde_json::json;
use trellis_sandbox::{CacheSetting, Engine, Grant, Limits, PluginRegistry};
use wasmtime::component::{Component, InstancePre, Linker, Val};
use wasmtime::{Config, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

const ARGS: &str = r#"{"path":"notes/a.md"}"#;

struct Trellis {
    registry: PluginRegistry,
    grant: Grant,
    limits: Limits,
}

impl Trellis {
    async fn call(&self) -> serde_json::Value {
        let args: serde_json::Value = serde_json::from_str(ARGS).unwrap();
        self.registry
            .call_tool("workspace:read_file", &args, &self.grant, &self.limits)
            .await
            .unwrap()
    }
}

struct BareState {
    wasi: WasiCtx,
    table: wasmtime::component::ResourceTable,
}

impl WasiView for BareState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

struct Bare {
    engine: wasmtime::Engine,
    pre: InstancePre<BareState>,
    notes: std::path::PathBuf,
}

impl Bare {
    fn new(component: &[u8], notes: &Path) -> Bare {
        let mut config = Config::new();
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(
            PoolingAllocationConfig::default(),
        ));
        let engine = wasmtime::Engine::new(&config).unwrap();
        let component = Component::new(&engine, component).unwrap();
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
        // The Trellis host interfaces are imported but never called by read_file:
        // stub them so the component links, with no Trellis code involved.
        for (name, item) in component.component_type().imports(&engine) {
            let wasmtime::component::types::ComponentItem::ComponentInstance(instance) = item.ty
            else {
                continue;
            };
            if !name.starts_with("trellis:") {
                continue;
            }
            let mut stub = linker.instance(name).unwrap();
            for (func, _) in instance.exports(&engine) {
                stub.func_new(func, |_, _, _, _| {
                    Err(wasmtime::Error::msg("not used by the benchmark"))
                })
                .unwrap();
            }
        }
        let pre = linker.instantiate_pre(&component).unwrap();
        Bare {
            engine,
            pre,
            notes: notes.to_path_buf(),
        }
    }

    async fn call(&self) -> String {
        let mut wasi = WasiCtxBuilder::new();
        // The same WASI setting as Trellis grants use, so only Trellis' own code differs.
        wasi.allow_blocking_current_thread(true);
        wasi.preopened_dir(&self.notes, "/notes", FsPerms::ReadOnly)
            .unwrap();
        let mut store = Store::new(
            &self.engine,
            BareState {
                wasi: wasi.build(),
                table: Default::default(),
            },
        );
        let instance = self.pre.instantiate_async(&mut store).await.unwrap();
        let interface = instance
            .get_export_index(&mut store, None, "trellis:plugin/tool@0.1.0")
            .unwrap();
        let func = instance
            .get_export_index(&mut store, Some(&interface), "call-tool")
            .unwrap();
        let func = instance.get_func(&mut store, func).unwrap();
        let mut results = [Val::Bool(false)];
        func.call_async(
            &mut store,
            &[Val::String("read_file".into()), Val::String(ARGS.into())],
            &mut results,
        )
        .await
        .unwrap();
        match &results[0] {
            Val::Result(Ok(Some(text))) => match &**text {
                Val::String(s) => s.clone(),
                other => panic!("unexpected {other:?}"),
            },
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn tool_call(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    std::fs::write(
        notes.join("a.md"),
        "# A note\nSmall file read by the benchmark.\n",
    )
    .unwrap();

    let cache = std::env::temp_dir().join("trellis-bench-cache");
    let engine = Engine::new(CacheSetting::Dir(cache)).unwrap();
    let trellis = Trellis {
        registry: runtime
            .block_on(PluginRegistry::with_bundled(&engine))
            .unwrap(),
        grant: Grant::none().read(&notes, "/notes").unwrap(),
        limits: Limits::default(),
    };
    let bare = Bare::new(trellis_sandbox::bundled::PLUGINS[0].component, &notes);

    // Same answer from both paths, or the comparison means nothing.
    let from_trellis = runtime.block_on(trellis.call());
    let from_bare: serde_json::Value =
        serde_json::from_str(&runtime.block_on(bare.call())).unwrap();
    assert_eq!(from_trellis, from_bare);
    assert_eq!(from_trellis["total_lines"], json!(2));

    let mut group = c.benchmark_group("tool_call");
    group.bench_function("trellis", |b| b.iter(|| runtime.block_on(trellis.call())));
    group.bench_function("bare_wasmtime", |b| {
        b.iter(|| runtime.block_on(bare.call()))
    });
    group.finish();

    // Interleaved sample for percentiles: drift in machine load hits both alike.
    let samples = 5_000;
    let (mut t, mut w) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for _ in 0..200 {
        runtime.block_on(trellis.call());
        runtime.block_on(bare.call());
    }
    for _ in 0..samples {
        let start = Instant::now();
        runtime.block_on(trellis.call());
        t.push(start.elapsed());
        let start = Instant::now();
        runtime.block_on(bare.call());
        w.push(start.elapsed());
    }
    t.sort();
    w.sort();
    let (t50, t99, w50, w99) = (
        percentile(&t, 0.5),
        percentile(&t, 0.99),
        percentile(&w, 0.5),
        percentile(&w, 0.99),
    );
    println!();
    println!("tool_call, {samples} interleaved calls each:");
    println!(
        "  trellis        p50 {:>8.1} us   p99 {:>8.1} us",
        micros(t50),
        micros(t99)
    );
    println!(
        "  bare wasmtime  p50 {:>8.1} us   p99 {:>8.1} us",
        micros(w50),
        micros(w99)
    );
    println!(
        "  ratio          p50 {:>8.2}      p99 {:>8.2}",
        micros(t50) / micros(w50),
        micros(t99) / micros(w99)
    );
}

criterion_group!(benches, tool_call);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
