//! The agent's loop: one turn per event source (a kernel event, the ticks, a link
//! notification, the scope and MTU refreshes, the probes' and rule reads' results, a
//! signal), until SIGINT or SIGTERM.

use super::*;

/// How often the conntrack counters are read, held stalls and black holes looked at
/// again, and the agent's own health checked; also how often the scope is refreshed
/// where link notifications cannot be had.
const REFRESH: Duration = Duration::from_secs(2);
/// How often the scope (the pods' namespaces and interfaces) is refreshed without a link
/// notification: they drive it, this is the safety net for notifications lost (a full
/// socket buffer is seen and handled as a change; this covers the rest).
const SCOPE_NET: Duration = Duration::from_secs(60);
/// The scope is refreshed at most this often on link notifications (bursts coalesce):
/// the first after a quiet spell at once, so a new pod's namespace is in before its
/// first connect; a node churning interfaces gets a refresh (a look at its links) at
/// most four times a second.
const SCOPE_SPACING: Duration = Duration::from_millis(250);
/// A burst's second scope refresh comes once its notifications paused this long (see
/// [`Coalesce::with_quiet`]).
const SCOPE_QUIET: Duration = Duration::from_millis(5);
/// The MTU model (which reads every pod's namespace) at most this often on them: a node
/// replacing a pod every 2 s is read whole once per replacement, not twice.
const MTU_SPACING: Duration = Duration::from_secs(2);
/// How often the MTU model is rebuilt without a link notification (pod namespaces
/// change without one in the agent's namespace).
const MTU_REFRESH: Duration = Duration::from_secs(10);

pub(crate) async fn run(opts: RunOptions) -> Result<(), AgentError> {
    let missing = caps::missing_for_agent(caps::effective());
    if !missing.is_empty() {
        return Err(AgentError::Privileges(missing.join(", ")));
    }
    // Before anything opens files: a runtime's default soft limit (1,024) is a port
    // scan's worth of idle connections.
    let limits = fds::raise_limit();
    info!(
        soft = limits.soft,
        hard = limits.hard,
        http_connection_budget = fds::connection_budget(),
        reserve = fds::RESERVE,
        "open-files limit"
    );
    // Subscribed before the agent takes its first look at the node and says it is ready:
    // a pod whose veth appears in between is then refreshed into the scope at the loop's
    // first turn, not 60 s later, and its first connect is judged.
    let link_changes = crate::host_network::watch();
    let (mut agent, mut events) = Agent::start(opts).await?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut refresh_tick = tokio::time::interval(REFRESH);
    refresh_tick.tick().await;
    let mut mtu_tick = tokio::time::interval(MTU_REFRESH);
    mtu_tick.tick().await;
    let mut link_changes = match link_changes {
        Ok(watch) => {
            agent.links = watch.links;
            Some(watch.changes)
        }
        Err(e) => {
            warn!(error = %e, "no link notifications: the scope is refreshed every {}s, MTU changes picked up every {}s", REFRESH.as_secs(), MTU_REFRESH.as_secs());
            None
        }
    };
    let mut scope_tick = scope_interval(link_changes.is_some()).await;
    let mut scope_due = Coalesce::with_quiet(SCOPE_SPACING, SCOPE_QUIET);
    let mut mtu_due = Coalesce::new(MTU_SPACING);
    loop {
        tokio::select! {
            ev = events.recv() => {
                let Some((kind, ev)) = ev else {
                    warn!("event stream ended");
                    break;
                };
                agent.on_event(kind, ev).await;
            }
            _ = tick.tick() => {
                agent.on_tick(!events.is_empty());
                agent.confirm_shrinks().await;
            }
            _ = mtu_tick.tick() => {
                agent.refresh_mtu(PodReads::Fresh).await;
                mtu_due.done(Instant::now());
            }
            changed = next_change(&mut link_changes) => {
                if changed.is_none() {
                    warn!("link notifications stopped: the scope is refreshed every {}s, MTU changes picked up every {}s", REFRESH.as_secs(), MTU_REFRESH.as_secs());
                    link_changes = None;
                    agent.links = None;
                    scope_tick = scope_interval(false).await;
                    continue;
                }
                scope_due.changed(Instant::now());
                mtu_due.changed(Instant::now());
            }
            () = coalesce::until(scope_due.due()) => {
                agent.on_scope();
                scope_due.done(Instant::now());
            }
            () = coalesce::until(mtu_due.due()) => {
                // The same notification made both due: the scope first, as the MTU model
                // enters every pod's namespace (long on a busy node) and a new pod's
                // first connect is tracked only once its namespace is in scope.
                if scope_due.due().is_some_and(|due| due <= Instant::now()) {
                    agent.on_scope();
                    scope_due.done(Instant::now());
                }
                agent.refresh_mtu(PodReads::Reuse).await;
                mtu_due.done(Instant::now());
            }
            _ = scope_tick.tick() => {
                // The safety net dumps the links again, whatever the notifications said.
                if let Some(links) = &agent.links {
                    crate::host_network::mark_stale(links);
                }
                agent.on_scope();
                scope_due.done(Instant::now());
            }
            _ = refresh_tick.tick() => {
                agent.on_refresh();
                agent.recheck_stalls().await;
                agent.ask_blackholes().await;
                agent.reprobe_path_blackholes();
            }
            done = agent.path_probes.next() => agent.on_path_probe(done),
            done = agent.rules.next() => agent.on_rule(done),
            _ = sigterm.recv() => { info!("SIGTERM: shutting down"); break; }
            _ = sigint.recv() => { info!("SIGINT: shutting down"); break; }
        }
    }
    agent.shutdown();
    Ok(())
}

/// The scope's periodic refresh: the safety net with link notifications, else every
/// [`REFRESH`]; its first tick (at once) taken.
async fn scope_interval(notified: bool) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(if notified { SCOPE_NET } else { REFRESH });
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    tick
}

/// Waits for the next link notification; never, without a watcher.
async fn next_change(rx: &mut Option<tokio::sync::mpsc::Receiver<()>>) -> Option<()> {
    match rx.as_mut() {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
