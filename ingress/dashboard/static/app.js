// otela dashboard: a plain client of this node's public API, nothing more.
//
// Views: the federation (GET /v1/models, /v1/registry/nodes, /v1/network, /v1/health,
// refreshed every few seconds), a key holder's key, usage and batches (GET /v1/me,
// /v1/me/usage, /v1/batches),
// a chat playground streaming through POST /v1/chat/completions exactly like any OpenAI
// client, and the admin's keys and federation-wide usage (/v1/admin/...). Secrets live in
// sessionStorage only, and every request goes to this node's own origin (the page's CSP
// forbids any other). All text from the network is inserted with textContent, never as
// HTML, since model names and key owners are chosen by other people.
"use strict";

(() => {
  const REFRESH_MS = 5000;
  const STORE = { key: "otela.apiKey", admin: "otela.adminToken" };
  // The SVG namespace is an identifier required by createElementNS; it is never fetched.
  const SVG_NS = "http://www.w3.org/2000/svg";
  // Usage periods (seconds) and the bucket each is drawn with: 24 to 60 bars.
  const BUCKETS = { 3600: 60, 86400: 3600, 604800: 21600, 2592000: 86400 };

  const $ = (id) => document.getElementById(id);
  const numberFormat = new Intl.NumberFormat();

  // ---------------------------------------------------------------- DOM helpers

  /** An element with attributes and children (strings become text nodes, never HTML). */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function svgEl(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    for (const child of children) node.append(child instanceof Node ? child : String(child));
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.setAttribute("class", value);
      else if (name === "text") node.textContent = value;
      else node.setAttribute(name, value === true ? "" : String(value));
    }
  }

  /** Show ``message`` in the alert paragraph ``id``, or hide it when empty. */
  function showError(id, message) {
    const node = $(id);
    node.textContent = message || "";
    node.hidden = !message;
  }

  /** Label each body cell with its column heading: on narrow screens the stylesheet shows
   * tables as one card per row, where the heading row is hidden. */
  function labelCells(tbody) {
    const heads = [...tbody.closest("table").querySelectorAll("thead th")]
      .map((th) => th.textContent.trim());
    for (const row of tbody.rows) {
      [...row.cells].forEach((cell, i) => {
        if (!heads[i] || cell.hasAttribute("colspan")) return;
        cell.setAttribute("data-label", heads[i]);
        if (cell.childNodes.length > 1) {  // one grid item beside the label, not several
          const wrap = el("div");
          wrap.append(...cell.childNodes);
          cell.append(wrap);
        }
      });
    }
  }

  function pill(text, tone, title) {
    return el("span", title ? { class: `pill ${tone}`, title } : { class: `pill ${tone}` }, text);
  }

  function meter(fraction, label) {
    const clamped = Math.max(0, Math.min(1, fraction));
    const bar = el("span", { class: "meter", role: "meter", "aria-label": label,
      "aria-valuemin": 0, "aria-valuemax": 100,
      "aria-valuenow": Math.round(clamped * 100) });
    const fill = el("span");
    fill.style.width = `${(clamped * 100).toFixed(1)}%`;
    bar.append(fill);
    return bar;
  }

  function fmt(n) {
    return n === null || n === undefined ? "—" : numberFormat.format(n);
  }

  function compact(n) {
    if (n >= 1e9) return `${+(n / 1e9).toFixed(1)}G`;
    if (n >= 1e6) return `${+(n / 1e6).toFixed(1)}M`;
    if (n >= 1e3) return `${+(n / 1e3).toFixed(1)}k`;
    return String(n);
  }

  function bytes(n) {
    if (!n) return "—";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
  }

  function when(unix) {
    return unix ? new Date(unix * 1000).toLocaleString() : "—";
  }

  function age(unix) {
    if (!unix) return "—";
    const s = Math.max(0, Date.now() / 1000 - unix);
    if (s < 90) return `${Math.round(s)} s ago`;
    if (s < 5400) return `${Math.round(s / 60)} min ago`;
    if (s < 172800) return `${Math.round(s / 3600)} h ago`;
    return `${Math.round(s / 86400)} d ago`;
  }

  function shortId(id) {
    return id && id.length > 16 ? `${id.slice(0, 8)}…${id.slice(-6)}` : id || "—";
  }

  function ms(value) {
    return value === null || value === undefined ? "—" : `${numberFormat.format(Math.round(value))} ms`;
  }

  function list(values, none) {
    return values && values.length ? values.join(", ") : none;
  }

  // ---------------------------------------------------------------- API

  /** An API failure as the server described it (OpenAI error shape), or a network one. */
  class ApiError extends Error {
    constructor(status, message, code) {
      super(message);
      this.status = status;
      this.code = code || null;
    }

    toString() {
      return this.status ? `${this.status}: ${this.message}` : this.message;
    }
  }

  /** The OpenAI-style error in ``response`` (or its text, if it is not JSON). */
  async function errorFrom(response) {
    let text = "";
    try { text = await response.text(); } catch (_) { /* body unreadable: keep status */ }
    let message = null;
    let code = null;
    try {
      const parsed = JSON.parse(text);
      const err = parsed && parsed.error;
      if (typeof err === "string") message = err;
      else if (err && typeof err.message === "string") { message = err.message; code = err.code; }
      else if (parsed && typeof parsed.detail === "string") message = parsed.detail;
    } catch (_) { /* not JSON: fall back to the text */ }
    if (!message) message = text.trim().slice(0, 300) || response.statusText || "request failed";
    return new ApiError(response.status, message, code);
  }

  // Single sign-on (docs/ingress.md#single-sign-on): calls made "as" SSO carry the
  // session cookie (every other call omits cookies) and the session's CSRF token.
  const SSO = Symbol("sso-session");
  const sso = { available: false, csrf: null, user: null };

  function headersFor(token, json) {
    const headers = { accept: "application/json" };
    if (token === SSO) { if (sso.csrf) headers["x-otela-csrf"] = sso.csrf; }
    else if (token) headers.authorization = `Bearer ${token}`;
    if (json) headers["content-type"] = "application/json";
    return headers;
  }

  async function send(path, { method = "GET", token = null, body, signal } = {}) {
    try {
      return await fetch(path, {
        method, signal, cache: "no-store", credentials: token === SSO ? "same-origin" : "omit",
        headers: headersFor(token, body !== undefined),
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (err) {
      if (err && err.name === "AbortError") throw err;
      throw new ApiError(0, `network error: cannot reach this node (${err && err.message})`);
    }
  }

  /** JSON from this node's API, or an ApiError. */
  async function api(path, options) {
    const response = await send(path, options);
    if (!response.ok) throw await errorFrom(response);
    return response.json();
  }

  /** What to tell the user about ``err``, with a hint where the status alone is cryptic. */
  function explain(err, feature) {
    const text = String(err);
    if (err instanceof ApiError && err.status === 404 && feature) {
      return `${text} (this node does not offer ${feature}: its ingress service runs only with --ingress-db)`;
    }
    return text;
  }

  function query(params) {
    return new URLSearchParams(Object.entries(params).map(([k, v]) => [k, String(v)])).toString();
  }

  function period(rangeSeconds) {
    const bucket = BUCKETS[rangeSeconds] || 3600;
    const until = Math.ceil(Date.now() / 1000);
    const since = Math.floor((until - rangeSeconds) / bucket) * bucket;
    return { since, until, bucket };
  }

  // ---------------------------------------------------------------- tabs

  const TABS = ["federation", "account", "playground", "admin"];
  const onShow = {};

  function selectTab(name, focus) {
    if (!TABS.includes(name)) name = "federation";
    for (const tab of TABS) {
      const button = $(`tab-${tab}`);
      const selected = tab === name;
      button.setAttribute("aria-selected", String(selected));
      button.tabIndex = selected ? 0 : -1;
      $(`view-${tab}`).hidden = !selected;
      if (selected && focus) button.focus();
    }
    if (location.hash !== `#${name}`) history.replaceState(null, "", `#${name}`);
    if (onShow[name]) onShow[name]();
  }

  function currentTab() {
    return TABS.find((tab) => !$(`view-${tab}`).hidden) || "federation";
  }

  function setupTabs() {
    const tablist = document.querySelector('[role="tablist"]');
    for (const tab of TABS) $(`tab-${tab}`).addEventListener("click", () => selectTab(tab));
    // Arrow keys move between tabs (WAI-ARIA tabs pattern).
    tablist.addEventListener("keydown", (event) => {
      const i = TABS.indexOf(currentTab());
      let next = null;
      if (event.key === "ArrowRight") next = TABS[(i + 1) % TABS.length];
      else if (event.key === "ArrowLeft") next = TABS[(i + TABS.length - 1) % TABS.length];
      else if (event.key === "Home") next = TABS[0];
      else if (event.key === "End") next = TABS[TABS.length - 1];
      if (next) { event.preventDefault(); selectTab(next, true); }
    });
    window.addEventListener("hashchange", () => selectTab(location.hash.slice(1)));
  }

  // ---------------------------------------------------------------- federation

  const fed = { models: [], timer: null, busy: false, ticks: 0 };

  const STATE_TONE = { SERVING: "ok", JOIN: "neutral", DOWN: "bad", LEFT: "neutral" };
  const STATE_ORDER = { SERVING: 0, JOIN: 1, DOWN: 2, LEFT: 3 };

  function gpuSummary(gpus) {
    const counts = new Map();
    for (const gpu of gpus || []) {
      const name = gpu.name || "GPU";
      const memory = gpu.memory_bytes ? ` ${bytes(gpu.memory_bytes)}` : "";
      const label = `${name}${memory}`;
      counts.set(label, (counts.get(label) || 0) + 1);
    }
    return [...counts].map(([label, n]) => `${n}× ${label}`).join(", ");
  }

  function hardwareText(hardware) {
    const gpus = gpuSummary(hardware && hardware.gpus);
    const cpu = hardware ? `${hardware.cpus || "?"} CPUs · ${bytes(hardware.memory_bytes)}` : "—";
    return { main: gpus || "CPU only", sub: cpu };
  }

  /** Load of one session: its gossiped report, or this node's own figure. */
  function loadOf(sessionId, network, health) {
    const routing = (network && network.routing) || {};
    if (health && sessionId === health.session_id && routing.own_load) return routing.own_load;
    return (routing.loads || {})[sessionId] || null;
  }

  /** Requests waiting at this ingress for room on the model's nodes, every class. */
  function queuedFor(modelId, network) {
    const queue = ((network && network.routing && network.routing.queue) || {})[modelId] || {};
    return Object.values(queue).reduce((sum, n) => sum + n, 0);
  }

  function loadCell(load) {
    if (!load) return el("td", { class: "muted" }, "no report");
    const capacity = load.capacity || 1;
    const parts = [`${fmt(load.in_flight)} in flight`];
    if (load.waiting !== null && load.waiting !== undefined) parts.push(`${fmt(load.waiting)} waiting`);
    if (load.kv_usage !== null && load.kv_usage !== undefined) parts.push(`KV ${Math.round(load.kv_usage * 100)} %`);
    if (load.slots) parts.push(`${fmt(load.slots)} slots`);
    if (load.queued) parts.push(`${fmt(load.queued)} queued here`);
    const fraction = load.in_flight / capacity;
    return el("td", {}, meter(fraction, `load ${Math.round(fraction * 100)} % of capacity`), " ",
      parts.join(" · "), el("span", { class: "sub-line" }, `capacity ${fmt(capacity)}`));
  }

  /** The model list when /v1/models is not open to us: every model in the registry. */
  function modelsFromRegistry(nodes) {
    const byId = new Map();
    for (const node of nodes) {
      if (node.state !== "SERVING") continue;
      for (const model of node.models || []) {
        const entry = byId.get(model.id) || { id: model.id, serving_nodes: 0,
          otela: { providers: [], gpu: [], engine: [], max_context: [] } };
        entry.serving_nodes += 1;
        const o = entry.otela;
        if (!o.providers.includes(node.provider_id)) o.providers.push(node.provider_id);
        if (node.engine && !o.engine.includes(node.engine)) o.engine.push(node.engine);
        if (model.max_context && !o.max_context.includes(model.max_context)) o.max_context.push(model.max_context);
        byId.set(model.id, entry);
      }
    }
    return [...byId.values()];
  }

  function renderModels(models, nodes, network, health) {
    const body = $("models-body");
    body.replaceChildren();
    $("models-empty").hidden = models.length > 0;
    for (const model of models.slice().sort((a, b) => a.id.localeCompare(b.id))) {
      const o = model.otela || {};
      const listing = nodes.filter((n) => (n.models || []).some((m) => m.id === model.id));
      const states = new Map();
      for (const n of listing) states.set(n.state, (states.get(n.state) || 0) + 1);
      const stateCell = el("td");
      for (const [state, n] of [...states].sort((a, b) => STATE_ORDER[a[0]] - STATE_ORDER[b[0]])) {
        stateCell.append(pill(`${n} ${state}`, STATE_TONE[state] || "neutral"), " ");
      }
      if (!states.size) stateCell.append(`${fmt(model.serving_nodes)} serving`);
      const hardware = new Set();
      for (const n of listing.filter((x) => x.state === "SERVING")) hardware.add(hardwareText(n.hardware).main);
      const serving = listing.filter((n) => n.state === "SERVING");
      let inFlight = 0;
      let capacity = 0;
      let reported = false;
      for (const n of serving) {
        const load = loadOf(n.session_id, network, health);
        if (load) { reported = true; inFlight += load.in_flight || 0; capacity += load.capacity || 0; }
      }
      const gpuText = (o.gpu && o.gpu.length) ? o.gpu.join(", ") : [...hardware].join("; ") || "—";
      body.append(el("tr", { "data-model": model.id },
        el("th", { scope: "row" }, el("span", { class: "mono" }, model.id)),
        el("td", {}, list(o.providers, model.owned_by || "—")),
        el("td", {}, gpuText),
        el("td", {}, list(o.engine, "—")),
        el("td", { class: "num" }, o.max_context && o.max_context.length
          ? o.max_context.map(fmt).join(", ") : fmt(model.max_model_len)),
        stateCell,
        reported ? loadCell({ in_flight: inFlight, capacity: capacity || 1,
          queued: queuedFor(model.id, network) })
          : el("td", { class: "muted" }, "no report"),
      ));
    }
    labelCells(body);
  }

  function reachabilityCell(node, network, health) {
    const self = health && node.session_id === health.session_id;
    const cell = el("td");
    if (self) {
      const nat = (network && network.nat) || {};
      cell.append(pill("this node", "ok"), " ", nat.reachability || node.reachability || "unknown");
      return cell;
    }
    const peer = ((network && network.peers) || {})[node.peer_id];
    const suspected = ((network && network.liveness && network.liveness.suspected) || {});
    const reach = node.reachability || "unknown";
    const tone = reach === "public" ? "ok" : reach === "unreachable" ? "bad"
      : reach === "private-relayed" ? "warn" : "neutral";
    cell.append(pill(reach, tone));
    if (Object.prototype.hasOwnProperty.call(suspected, node.peer_id)) cell.append(" ", pill("suspected", "warn"));
    const details = [];
    if (peer && peer.connection) details.push(peer.connection);
    if (peer && peer.last_contact) details.push(`contact ${age(peer.last_contact)}`);
    if (peer && peer.dial_errors && peer.dial_errors.length) details.push(`${peer.dial_errors.length} dial errors`);
    const ejected = ((network && network.routing && network.routing.ejected) || {})[node.session_id];
    if (ejected) details.push(`ejected for ${Math.ceil(ejected.remaining_s || 0)} s`);
    if (details.length) cell.append(el("span", { class: "sub-line" }, details.join(" · ")));
    return cell;
  }

  /**
   * One row per node: a node that restarted (same peer id, a new session) keeps its old
   * session's LEFT record in the registry for a while; its newest session stands for it,
   * and the row says how many earlier sessions it had.
   */
  function newestSessions(nodes) {
    const byPeer = new Map();
    for (const node of nodes) {
      const seen = byPeer.get(node.peer_id);
      const live = (n) => n.state !== "LEFT";
      if (!seen) {
        byPeer.set(node.peer_id, { node, earlier: 0 });
      } else {
        seen.earlier += 1;
        const newer = live(node) !== live(seen.node) ? live(node)
          : (node.updated_at || 0) > (seen.node.updated_at || 0);
        if (newer) seen.node = node;
      }
    }
    return [...byPeer.values()].map(({ node, earlier }) => ({ ...node, earlier }));
  }

  function renderNodes(nodes, network, health) {
    const body = $("nodes-body");
    body.replaceChildren();
    const sorted = newestSessions(nodes).sort((a, b) =>
      (STATE_ORDER[a.state] ?? 9) - (STATE_ORDER[b.state] ?? 9)
      || String(a.provider_id).localeCompare(String(b.provider_id)));
    for (const node of sorted) {
      const roles = [];
      if (node.ingress) roles.push("ingress");
      if (node.engine) roles.push(`engine: ${node.engine}`);
      if (node.relay) roles.push("relay");
      if (node.idle) roles.push("idle capacity");
      const hw = hardwareText(node.hardware);
      const slurm = node.slurm ? `Slurm job ${node.slurm.job_id}` : null;
      body.append(el("tr", { "data-session": node.session_id },
        el("th", { scope: "row" },
          el("span", { class: "mono", title: node.peer_id }, shortId(node.peer_id)),
          el("span", { class: "sub-line" }, node.http_url || ""),
          node.earlier ? el("span", { class: "sub-line" },
            `restarted: ${node.earlier} earlier ${node.earlier === 1 ? "session" : "sessions"}`)
            : null),
        el("td", {}, node.provider_id || "—"),
        el("td", {}, roles.join(", ") || "—", slurm ? el("span", { class: "sub-line" }, slurm) : null),
        el("td", {}, pill(node.display_state || node.state, STATE_TONE[node.state] || "neutral",
          node.display_state && node.display_state !== node.state ? `lifecycle ${node.state}` : null)),
        el("td", {}, hw.main, el("span", { class: "sub-line" }, hw.sub)),
        el("td", {}, list((node.models || []).map((m) => m.id), "—")),
        reachabilityCell(node, network, health),
        node.state === "LEFT" ? el("td", { class: "muted" }, "—")
          : loadCell(loadOf(node.session_id, network, health)),
        el("td", {}, age(node.updated_at)),
      ));
    }
    labelCells(body);
  }

  // Said while a node that just started catches up with its peers' registry: models it
  // has not heard of yet are missing for a moment (requests for them wait, never a 404).
  const WARMING = "registry warming: catching up with its peers, models may be missing for a moment";

  function renderSummary(health) {
    const warming = health.registry_warming ? [WARMING] : [];
    if (health.peer_id === undefined) {  // liveness only: sign in to see the rest
      $("node-summary").textContent = [health.display_state || health.state, `v${health.version}`,
        ...warming, "sign in to see this node's details"].join(" · ");
      return;
    }
    const parts = [`node ${shortId(health.peer_id)}`, `provider ${health.provider_id}`,
      health.display_state || health.state, `${fmt(health.connected_peers)} ${health.connected_peers === 1 ? "peer" : "peers"}`,
      `v${health.version}`, ...warming];
    $("node-summary").textContent = parts.join(" · ");
  }

  async function refreshFederation() {
    if (fed.busy) return;
    fed.busy = true;
    try {
      const token = sessionStorage.getItem(STORE.key);
      // A keyed ingress shows its registry, network and full health to key holders and
      // the admin only (docs/security.md): ask with whichever credential this tab holds.
      const seeing = token || sessionStorage.getItem(STORE.admin);
      // Without a credential, ask only for what this node shows strangers (its public
      // health says which views need one): a refusal is not an error to collect.
      const health = await api("/v1/health", { token: seeing }).then(
        (value) => ({ status: "fulfilled", value }), (reason) => ({ status: "rejected", reason }));
      const hidden = (view) => !seeing && health.status === "fulfilled" && health.value.visibility
        && health.value.visibility[view] && health.value.visibility[view] !== "public";
      const withheld = new ApiError(401, "sign in to see this");
      const [nodesDoc, network, modelsDoc] = await Promise.allSettled([
        hidden("registry") ? Promise.reject(withheld) : api("/v1/registry/nodes?limit=1000", { token: seeing }),
        hidden("network") ? Promise.reject(withheld) : api("/v1/network", { token: seeing }),
        api("/v1/models", { token }),
      ]);
      const errors = [];
      let note = "";
      const refused = (doc) => doc.status === "rejected" && doc.reason instanceof ApiError
        && (doc.reason.status === 401 || doc.reason.status === 403);
      if (refused(nodesDoc) || refused(network)) {
        note = " · sign in to see the federation's nodes";  // not shown to strangers here
      }
      const nodes = nodesDoc.status === "fulfilled" ? nodesDoc.value.nodes || [] : [];
      if (nodesDoc.status === "rejected" && !refused(nodesDoc)) errors.push(`nodes: ${nodesDoc.reason}`);
      const net = network.status === "fulfilled" ? network.value : null;
      if (network.status === "rejected" && !refused(network)) errors.push(`network: ${network.reason}`);
      const me = health.status === "fulfilled" ? health.value : null;
      if (me) renderSummary(me);
      else errors.push(`health: ${health.reason}`);
      let models;
      if (modelsDoc.status === "fulfilled") {
        models = modelsDoc.value.data || [];
      } else if (modelsDoc.reason instanceof ApiError
                 && (modelsDoc.reason.status === 401 || modelsDoc.reason.status === 403)) {
        // This key is refused (revoked, expired): show what anyone may see, the public
        // catalog where there is one, else the registry's models.
        const open = token ? await api("/v1/models").catch(() => null) : null;
        models = open ? open.data || [] : modelsFromRegistry(nodes);
        note += " · every model in the registry (sign in with a key to see those you may use)";
      } else {
        models = modelsFromRegistry(nodes);
        errors.push(`models: ${modelsDoc.reason}`);
      }
      fed.models = models;
      renderModels(models, nodes, net, me);
      const warming = (me && me.registry_warming)
        || (modelsDoc.status === "fulfilled" && modelsDoc.value.registry_warming);
      $("models-empty").textContent = warming
        ? "This node's registry is still catching up with its peers: models appear in a moment."
        : "No model is served by a node you may use.";
      renderNodes(nodes, net, me);
      updateModelChoices();
      $("network-verdict").textContent = net && net.verdict ? `This node: ${net.verdict}` : "";
      $("fed-updated").textContent =
        `updated ${new Date().toLocaleTimeString()} · every ${REFRESH_MS / 1000} s${note}`;
      showError("fed-error", errors.join("; "));
    } finally {
      fed.busy = false;
    }
  }

  /** Refresh while the page is visible; a hidden tab costs the node nothing. The
   * federation every tick (the playground's model list comes from it too), a key holder's
   * view every third while it is shown. */
  function scheduleFederation() {
    clearTimeout(fed.timer);
    fed.timer = setTimeout(async () => {
      fed.ticks += 1;
      if (!document.hidden) {
        await refreshFederation().catch(reportBug);
        if (fed.ticks % 3 === 0 && account.key && currentTab() === "account") {
          await refreshAccount().catch(reportBug);
        }
      }
      scheduleFederation();
    }, REFRESH_MS);
  }

  // ---------------------------------------------------------------- my key

  const account = { key: null, info: null };

  const STATUS_TONE = { active: "ok", revoked: "bad", expired: "warn", "over budget": "warn" };

  /** The key's status as the API states it (the CLI shows the same word); computed here
   * only for an answer that carries none. */
  function keyStatus(key) {
    if (key.status) return [key.status, STATUS_TONE[key.status] || "neutral"];
    if (key.revoked_at) return ["revoked", "bad"];
    if (key.expires_at && key.expires_at < Date.now() / 1000) return ["expired", "warn"];
    if (key.budget_tokens && key.used_tokens >= key.budget_tokens) return ["over budget", "warn"];
    return ["active", "ok"];
  }

  function limitsText(limits) {
    const l = limits || {};
    const parts = [];
    if (l.rpm) parts.push(`${fmt(l.rpm)} req/min`);
    if (l.tpm) parts.push(`${fmt(l.tpm)} tokens/min`);
    if (l.max_concurrent) parts.push(`${fmt(l.max_concurrent)} concurrent`);
    return parts.join(" · ") || "none";
  }

  /** Use against the key's budget in its period (tokens and/or spend); its team's budget
   * shows in the status ("over budget") when that is the one used up. */
  function budgetNode(key) {
    const used = key.budget_used || { tokens: key.used_tokens || 0, spend: 0 };
    const parts = [];
    let fraction = 0;
    if (key.budget_tokens) {
      fraction = Math.max(fraction, used.tokens / key.budget_tokens);
      parts.push(`${fmt(used.tokens)} of ${fmt(key.budget_tokens)}`);
    }
    if (key.budget_spend) {
      fraction = Math.max(fraction, (used.spend || 0) / key.budget_spend);
      parts.push(`spent ${(used.spend || 0).toFixed(2)} of ${key.budget_spend}`);
    }
    if (!parts.length) return `${fmt(key.used_tokens)} (no budget)`;
    const period = key.budget_period && key.budget_period !== "lifetime"
      ? ` this ${key.budget_period}` : "";
    return el("span", {}, meter(Math.min(1, fraction),
      `${Math.round(fraction * 100)} % of the budget used`), ` ${parts.join(", ")}${period}`);
  }

  function renderKeyInfo(key) {
    const [status, tone] = keyStatus(key);
    const rows = [
      ["Key", el("span", { class: "mono" }, key.id)],
      ["Name", key.name || "—"],
      ["Owner", key.owner || "—"],
      ["Status", pill(status, tone)],
      ["Created", when(key.created_at)],
      ["Expires", key.expires_at ? when(key.expires_at) : "never"],
      ["Models", list(key.models, "all")],
      ["Providers", list(key.providers, "all the ingress trusts")],
      ["Limits", limitsText(key.limits)],
      ["Tokens used", budgetNode(key)],
    ];
    $("key-info").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  }

  function showAccount(signedIn) {
    $("key-form").hidden = signedIn;
    $("account").hidden = !signedIn;
    updateIdentity();
  }

  async function signInKey(event) {
    event.preventDefault();
    const key = $("key-input").value.trim();
    if (!key) return;
    showError("key-form-error", "");
    try {
      account.info = await api("/v1/me", { token: key });
    } catch (err) {
      if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
        showError("key-form-error", String(err));  // the key itself is refused
        return;
      }
      account.info = null;  // signed in, but this node cannot describe the key (shown below)
      showError("account-error", explain(err, "API keys"));
    }
    account.key = key;
    sessionStorage.setItem(STORE.key, key);
    $("key-input").value = "";
    showAccount(true);
    if (account.info) { showError("account-error", ""); renderKeyInfo(account.info); }
    else $("key-info").replaceChildren();
    await refreshUsage();
    await refreshBatches();
    refreshFederation().catch(reportBug);  // the model list may widen with a key
  }

  function signOutKey() {
    sessionStorage.removeItem(STORE.key);
    account.key = null;
    account.info = null;
    $("key-info").replaceChildren();
    $("usage-chart").replaceChildren();
    $("usage-totals").replaceChildren();
    $("batches-body").replaceChildren();
    $("batches-empty").hidden = true;
    showError("account-error", "");
    showError("usage-error", "");
    showError("batches-error", "");
    showAccount(false);
    $("key-input").focus();
  }

  async function refreshAccount() {
    if (!account.key) return;
    try {
      account.info = await api("/v1/me", { token: account.key });
      renderKeyInfo(account.info);
      showError("account-error", "");
    } catch (err) {
      showError("account-error", explain(err, "API keys"));
    }
    updateIdentity();
    await refreshUsage();
    await refreshBatches();
  }

  async function refreshUsage() {
    if (!account.key) return;
    const range = Number($("usage-range").value);
    const { since, until, bucket } = period(range);
    try {
      const usage = await api(`/v1/me/usage?${query({ since, until, bucket })}`, { token: account.key });
      showError("usage-error", "");
      $("usage-figure").hidden = false;
      renderTotals(usage.totals || {});
      drawUsage($("usage-chart"), usage.buckets || [], since, until, bucket,
        $("usage-range").selectedOptions[0].textContent);
    } catch (err) {
      showError("usage-error", explain(err, "usage"));
      $("usage-figure").hidden = true;
      $("usage-chart").replaceChildren();
      $("usage-totals").replaceChildren();
    }
  }

  // ---------------------------------------------------------------- my batches

  const BATCH_TONE = { completed: "ok", failed: "bad", expired: "bad", cancelled: "warn",
    cancelling: "warn", in_progress: "neutral", validating: "neutral", finalizing: "neutral" };

  /** The key's latest batches (GET /v1/batches) with their progress: lines done (answered
   * or failed) of all lines. */
  async function refreshBatches() {
    if (!account.key) return;
    try {
      const page = await api("/v1/batches?limit=20", { token: account.key });
      showError("batches-error", "");
      renderBatches(page.data || []);
    } catch (err) {
      showError("batches-error", explain(err, "the Batch API"));
      $("batches-body").replaceChildren();
      $("batches-empty").hidden = true;
    }
  }

  function batchProgress(batch) {
    const c = batch.request_counts || {};
    const total = c.total || 0;
    const done = (c.completed || 0) + (c.failed || 0);
    const text = total ? `${fmt(done)} of ${fmt(total)}` : "—";
    const failed = c.failed ? ` (${fmt(c.failed)} failed)` : "";
    if (!total) return text;
    return el("span", {}, meter(done / total, `${Math.round(done / total * 100)} % of the lines done`),
      ` ${text}${failed}`);
  }

  function renderBatches(batches) {
    const rows = batches.map((b) => el("tr", {},
      el("td", { class: "mono", title: b.id }, shortId(b.id)),
      el("td", { class: "mono" }, b.endpoint || "—"),
      el("td", {}, pill(b.status, BATCH_TONE[b.status] || "neutral")),
      el("td", {}, batchProgress(b)),
      el("td", { title: when(b.created_at) }, age(b.created_at)),
      el("td", { class: "mono" }, [b.output_file_id && `output ${shortId(b.output_file_id)}`,
        b.error_file_id && `errors ${shortId(b.error_file_id)}`].filter(Boolean).join(" · ") || "—")));
    $("batches-body").replaceChildren(...rows);
    labelCells($("batches-body"));
    $("batches-empty").hidden = batches.length > 0;
  }

  function renderTotals(totals) {
    const rows = [["Requests", totals.requests], ["Prompt tokens", totals.prompt_tokens],
      ["Completion tokens", totals.completion_tokens], ["Errors", totals.errors]];
    $("usage-totals").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, fmt(v || 0))]));
  }

  function niceCeiling(n) {
    if (n <= 0) return 1;
    const power = 10 ** Math.floor(Math.log10(n));
    for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= n) return step * power;
    return 10 * power;
  }

  function tickLabel(unix, bucket) {
    const d = new Date(unix * 1000);
    if (bucket < 3600) return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    if (bucket < 86400) return d.toLocaleString([], { weekday: "short", hour: "2-digit" });
    return d.toLocaleDateString([], { month: "short", day: "numeric" });
  }

  /** Stacked token bars per bucket, errors as dots; drawn as inline SVG (no library). */
  const chart = { last: null, resizeTimer: null };

  /** Drawn at the container's width in pixels (not scaled), so text keeps its size. */
  function drawUsage(container, buckets, since, until, bucket, periodText) {
    chart.last = [container, buckets, since, until, bucket, periodText];
    const W = Math.max(300, Math.round(container.getBoundingClientRect().width) || 720);
    const H = 220;
    const pad = { l: 48, r: 12, t: 12, b: 28 };
    const byStart = new Map(buckets.map((b) => [Math.floor(b.start / bucket) * bucket, b]));
    const series = [];
    for (let start = since; start < until; start += bucket) {
      const b = byStart.get(start) || {};
      series.push({ start, requests: b.requests || 0, prompt: b.prompt_tokens || 0,
        completion: b.completion_tokens || 0, errors: b.errors || 0 });
    }
    // Buckets the server placed elsewhere (a different alignment) still count.
    for (const b of buckets) {
      const start = Math.floor(b.start / bucket) * bucket;
      if (start < since || start >= until) continue;
      if (!series.some((s) => s.start === start)) {
        series.push({ start, requests: b.requests || 0, prompt: b.prompt_tokens || 0,
          completion: b.completion_tokens || 0, errors: b.errors || 0 });
      }
    }
    series.sort((a, b) => a.start - b.start);
    const total = series.reduce((acc, s) => acc + s.prompt + s.completion, 0);
    const requests = series.reduce((acc, s) => acc + s.requests, 0);
    const top = niceCeiling(Math.max(...series.map((s) => s.prompt + s.completion), 0));
    const plotW = W - pad.l - pad.r;
    const plotH = H - pad.t - pad.b;
    const slot = plotW / Math.max(series.length, 1);
    const y = (v) => pad.t + plotH - (v / top) * plotH;
    const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
      "aria-labelledby": "usage-chart-title", id: "usage-svg" });
    svg.append(svgEl("title", { id: "usage-chart-title" },
      `Tokens per ${bucket >= 86400 ? "day" : bucket >= 3600 ? `${bucket / 3600} h` : `${bucket / 60} min`}`
      + ` over the ${periodText}: ${fmt(total)} tokens in ${fmt(requests)} requests`));
    for (let i = 0; i <= 4; i += 1) {
      const value = (top / 4) * i;
      svg.append(svgEl("line", { class: i ? "grid" : "axis", x1: pad.l, x2: W - pad.r, y1: y(value), y2: y(value) }));
      svg.append(svgEl("text", { x: pad.l - 6, y: y(value) + 4, "text-anchor": "end" }, compact(value)));
    }
    const labelEvery = Math.max(1, Math.ceil(series.length / 6));
    series.forEach((s, i) => {
      const x = pad.l + i * slot + slot * 0.15;
      const w = Math.max(slot * 0.7, 1);
      const group = svgEl("g", { class: "bucket", "data-start": s.start });
      group.append(svgEl("title", {}, `${tickLabel(s.start, Math.min(bucket, 3599))}: `
        + `${fmt(s.requests)} requests, ${fmt(s.prompt)} prompt + ${fmt(s.completion)} completion tokens`
        + `, ${fmt(s.errors)} errors`));
      if (s.prompt) group.append(svgEl("rect", { class: "bar-prompt", x, width: w, y: y(s.prompt), height: y(0) - y(s.prompt) }));
      if (s.completion) {
        group.append(svgEl("rect", { class: "bar-completion", x, width: w,
          y: y(s.prompt + s.completion), height: y(s.prompt) - y(s.prompt + s.completion) }));
      }
      if (s.errors) group.append(svgEl("circle", { class: "dot-errors", cx: x + w / 2, cy: pad.t + 4, r: 3.5 }));
      // An invisible full-height target so the tooltip works on empty buckets too.
      group.append(svgEl("rect", { x: pad.l + i * slot, width: slot, y: pad.t, height: plotH, fill: "transparent" }));
      svg.append(group);
      if (i % labelEvery === 0) {
        svg.append(svgEl("text", { x: pad.l + i * slot + slot / 2, y: H - 8, "text-anchor": "middle" },
          tickLabel(s.start, bucket)));
      }
    });
    if (!total) {
      svg.append(svgEl("text", { x: pad.l + plotW / 2, y: pad.t + plotH / 2, "text-anchor": "middle" },
        "No tokens used in this period"));
    }
    container.replaceChildren(svg);
  }

  // ---------------------------------------------------------------- playground

  const chat = { history: [], controller: null };

  function updateIdentity() {
    const key = sessionStorage.getItem(STORE.key);
    const info = account.info;
    $("chat-identity").textContent = key
      ? `Requests use your API key${info ? ` ${info.id}${info.name ? ` (${info.name})` : ""}` : ""}.`
      : "Not signed in: requests are sent without an API key, which only an open ingress accepts. "
        + "Sign in under “My key”.";
  }

  function updateModelChoices() {
    const select = $("chat-model");
    const current = select.value;
    const ids = fed.models.map((m) => m.id).sort();
    const existing = [...select.options].map((o) => o.value);
    if (ids.join("\n") === existing.join("\n")) return;
    select.replaceChildren(...ids.map((id) => el("option", { value: id }, id)));
    if (ids.includes(current)) select.value = current;
    $("chat-send").disabled = !ids.length || chat.controller !== null;
    if (!ids.length) $("chat-status").textContent = "No model is being served right now.";
    else if ($("chat-status").textContent === "No model is being served right now.") $("chat-status").textContent = "";
  }

  function addTurn(role, text) {
    const item = el("li", { class: role },
      el("span", { class: "who" }, role === "user" ? "You" : "Assistant"),
      el("span", { class: "text" }, text),
      el("span", { class: "meta" }));
    $("transcript").append(item);
    item.scrollIntoView({ block: "nearest" });
    return item;
  }

  /** Server-sent events from a fetch body, one ``data`` payload at a time. */
  async function* sseData(body, signal) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let match;
        while ((match = /\r?\n\r?\n/.exec(buffer)) !== null) {
          const event = buffer.slice(0, match.index);
          buffer = buffer.slice(match.index + match[0].length);
          const data = event.split(/\r?\n/).filter((line) => line.startsWith("data:"))
            .map((line) => line.slice(line.startsWith("data: ") ? 6 : 5)).join("\n");
          if (data) yield data;
        }
      }
      buffer += decoder.decode();
      const rest = buffer.split(/\r?\n/).filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(line.startsWith("data: ") ? 6 : 5)).join("\n");
      if (rest) yield rest;
    } finally {
      if (signal && signal.aborted) reader.cancel().catch(() => {});
      reader.releaseLock();
    }
  }

  function setChatBusy(busy) {
    $("chat-send").disabled = busy || !fed.models.length;
    $("chat-stop").disabled = !busy;
    $("chat-input").readOnly = busy;
  }

  async function sendChat(event) {
    event.preventDefault();
    const text = $("chat-input").value.trim();
    const model = $("chat-model").value;
    if (!text || !model || chat.controller) return;
    showError("chat-error", "");
    const maxTokens = parseInt($("chat-max-tokens").value, 10);
    const messages = [...chat.history, { role: "user", content: text }];
    const userTurn = addTurn("user", text);
    const reply = addTurn("assistant", "");
    reply.setAttribute("aria-busy", "true");
    $("chat-input").value = "";
    const controller = new AbortController();
    chat.controller = controller;
    setChatBusy(true);
    $("chat-status").textContent = `Waiting for ${model}…`;
    const started = performance.now();
    let firstToken = null;
    let answer = "";
    let usage = null;
    let finish = null;
    let outcome = "done";
    let servedBy = "";
    try {
      const body = { model, messages, stream: true, stream_options: { include_usage: true } };
      if (maxTokens > 0) body.max_tokens = maxTokens;
      const response = await send("/v1/chat/completions", {
        method: "POST", body, signal: controller.signal, token: sessionStorage.getItem(STORE.key),
      });
      if (!response.ok) throw await errorFrom(response);
      const provider = response.headers.get("x-otela-provider-id");
      servedBy = provider ? `served by ${provider}` : "";
      $("chat-status").textContent = "Streaming…";
      for await (const data of sseData(response.body, controller.signal)) {
        if (data === "[DONE]") break;
        let chunk;
        try { chunk = JSON.parse(data); } catch (_) { continue; }
        if (chunk.error) {
          const err = chunk.error;
          throw new ApiError(err.status || response.status, err.message || String(err), err.code);
        }
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices || []) {
          const piece = choice.delta && choice.delta.content;
          if (piece) {
            if (firstToken === null) firstToken = performance.now() - started;
            answer += piece;
            reply.querySelector(".text").textContent = answer;
          }
          if (choice.finish_reason) finish = choice.finish_reason;
        }
        reply.scrollIntoView({ block: "nearest" });
      }
    } catch (err) {
      if (err && err.name === "AbortError") {
        outcome = "stopped";
      } else {
        outcome = "failed";
        showError("chat-error", explain(err));
      }
    } finally {
      chat.controller = null;
      setChatBusy(false);
      reply.setAttribute("aria-busy", "false");
    }
    const total = performance.now() - started;
    if (outcome === "failed" && !answer) {
      // Nothing came back: the turn is not part of the conversation; offer the text again.
      reply.remove();
      userTurn.querySelector(".meta").textContent = "not answered (see the error below)";
      userTurn.classList.add("unsent");
      if (!$("chat-input").value) $("chat-input").value = text;
      $("chat-status").textContent = "";
      return;
    }
    chat.history = [...messages, { role: "assistant", content: answer }];
    const meta = [];
    if (outcome !== "done") meta.push(outcome);
    if (finish && finish !== "stop") meta.push(`finish: ${finish}`);
    if (usage) meta.push(`${fmt(usage.prompt_tokens)} prompt + ${fmt(usage.completion_tokens)} completion tokens`);
    if (firstToken !== null) meta.push(`first token ${ms(firstToken)}`);
    meta.push(`total ${ms(total)}`);
    if (servedBy) meta.push(servedBy);
    reply.querySelector(".meta").textContent = meta.join(" · ");
    reply.setAttribute("data-outcome", outcome);
    // Announced once (the transcript itself is not a live region: every token would be).
    $("chat-status").textContent = `Answer ${outcome === "done" ? "complete" : outcome}.`;
    if (account.key) refreshAccount().catch(reportBug);
  }

  function clearChat() {
    if (chat.controller) chat.controller.abort();
    chat.history = [];
    $("transcript").replaceChildren();
    showError("chat-error", "");
    $("chat-status").textContent = "";
    $("chat-input").focus();
  }

  // ---------------------------------------------------------------- admin

  const admin = { token: null, keys: [], arming: null, busy: new Set(), page: 0 };
  const KEYS_PER_PAGE = 20;

  /** The keys the search box matches: its words, each in the key's id, name, owner, team
   * or status (case-insensitive). */
  /** A key's user as people read it: email, else name, else id. */
  function userName(key) {
    const user = key.user || {};
    return user.email || user.name || key.user_id || "";
  }

  function matchingKeys(keys) {
    const words = $("keys-search").value.toLowerCase().split(/\s+/).filter(Boolean);
    if (!words.length) return keys;
    return keys.filter((key) => {
      const text = [key.id, key.name, key.owner, key.scheduling && key.scheduling.team,
        key.user && key.user.email, key.user_id, keyStatus(key)[0]].filter(Boolean).join(" ")
        .toLowerCase();
      return words.every((word) => text.includes(word));
    });
  }

  function showAdmin(signedIn) {
    $("admin-form").hidden = signedIn;
    $("admin").hidden = !signedIn;
  }

  async function signInAdmin(event) {
    event.preventDefault();
    const token = $("admin-input").value.trim();
    if (!token) return;
    showError("admin-form-error", "");
    let keys = null;
    let failure = null;
    try {
      keys = await api("/v1/admin/keys", { token });
    } catch (err) {
      if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
        showError("admin-form-error", String(err));
        return;
      }
      failure = err;
    }
    admin.token = token;
    sessionStorage.setItem(STORE.admin, token);
    $("admin-input").value = "";
    showAdmin(true);
    if (keys) renderKeys(keys.data || []);
    showError("admin-error", failure ? explain(failure, "an admin API") : "");
    await refreshAdminUsage();
    await refreshLog(false);
  }

  function signOutAdmin() {
    if (admin.token === SSO) { signOutSso().catch(reportBug); return; }
    sessionStorage.removeItem(STORE.admin);
    admin.token = null;
    admin.keys = [];
    $("keys-body").replaceChildren();
    $("admin-usage-body").replaceChildren();
    hideSecret();
    showError("admin-error", "");
    showError("admin-usage-error", "");
    showAdmin(false);
    $("admin-input").focus();
  }

  async function refreshAdmin() {
    if (!admin.token) return;
    try {
      const keys = await api("/v1/admin/keys", { token: admin.token });
      renderKeys(keys.data || []);
      showError("admin-error", "");
    } catch (err) {
      showError("admin-error", explain(err, "an admin API"));
    }
    await refreshAdminUsage();
    await refreshLog(false);
  }

  function renderKeys(keys) {
    admin.keys = keys;
    const body = $("keys-body");
    body.replaceChildren();
    const matching = matchingKeys(keys).sort((a, b) => (b.created_at || 0) - (a.created_at || 0));
    const pages = Math.max(1, Math.ceil(matching.length / KEYS_PER_PAGE));
    admin.page = Math.min(admin.page, pages - 1);
    const first = admin.page * KEYS_PER_PAGE;
    const sorted = matching.slice(first, first + KEYS_PER_PAGE);
    $("keys-page").textContent = matching.length
      ? `${fmt(first + 1)}–${fmt(first + sorted.length)} of ${fmt(matching.length)}`
        + (matching.length !== keys.length ? ` (of ${fmt(keys.length)} keys)` : "")
      : "";
    $("keys-prev").disabled = admin.page === 0;
    $("keys-next").disabled = admin.page >= pages - 1;
    for (const key of sorted) {
      const [status, tone] = keyStatus(key);
      const actions = el("div", { class: "actions" });
      const label = key.name || key.id;
      const busy = admin.busy.has(key.id);
      for (const [action, text, tone, run] of [["rotate", "Rotate", "secondary", rotateKey],
        ["revoke", "Revoke", "danger", revokeKey]]) {
        const armed = admin.arming && admin.arming.keyId === key.id && admin.arming.action === action;
        const button = el("button", { type: "button", class: tone, "data-action": action,
          "aria-label": `${armed ? "Confirm: " : ""}${text} key ${label}`,
          "aria-pressed": armed ? "true" : null }, armed ? `Confirm ${action}` : text);
        button.disabled = Boolean(key.revoked_at) || busy;
        button.addEventListener("click", () => confirmThen(key, action, run));
        actions.append(button);
      }
      body.append(el("tr", { "data-key": key.id },
        el("th", { scope: "row" }, key.name || "(unnamed)",
          el("span", { class: "sub-line mono" }, key.id)),
        el("td", {}, key.owner || "—",
          key.user_id ? el("span", { class: "sub-line" }, `user ${userName(key)}`) : null),
        el("td", {}, pill(status, tone),
          key.expires_at && !key.revoked_at ? el("span", { class: "sub-line" }, `expires ${when(key.expires_at)}`) : null,
          key.revoked_at ? el("span", { class: "sub-line" }, when(key.revoked_at)) : null),
        el("td", {}, `models: ${list(key.models, "all")}`,
          el("span", { class: "sub-line" }, `providers: ${list(key.providers, "all")}`)),
        el("td", {}, limitsText(key.limits)),
        el("td", {}, budgetNode(key)),
        el("td", {}, age(key.created_at)),
        el("td", {}, actions),
      ));
    }
    if (!sorted.length) {
      body.append(el("tr", {}, el("td", { colspan: 8, class: "muted" },
        keys.length ? "No key matches the search." : "No keys yet.")));
    }
    labelCells(body);
  }

  /** A destructive action takes two clicks: the first arms it for five seconds. The
   * armed state is kept by key and action, not by button, so it survives the table being
   * redrawn in between. */
  function confirmThen(key, action, run) {
    const armed = admin.arming;
    if (armed) clearTimeout(armed.timer);
    if (armed && armed.keyId === key.id && armed.action === action) {
      admin.arming = null;
      admin.busy.add(key.id);
      renderKeys(admin.keys);
      run(key).finally(() => { admin.busy.delete(key.id); renderKeys(admin.keys); });
      return;
    }
    admin.arming = { keyId: key.id, action, timer: setTimeout(disarm, 5000) };
    renderKeys(admin.keys);
  }

  function disarm() {
    if (!admin.arming) return;
    clearTimeout(admin.arming.timer);
    admin.arming = null;
    renderKeys(admin.keys);
  }

  async function revokeKey(key) {
    try {
      await api(`/v1/admin/keys/${encodeURIComponent(key.id)}/revoke`, { method: "POST", token: admin.token });
      showError("admin-error", "");
    } catch (err) {
      showError("admin-error", explain(err, "an admin API"));
    }
    await refreshAdmin();
  }

  async function rotateKey(key) {
    try {
      const rotated = await api(`/v1/admin/keys/${encodeURIComponent(key.id)}/rotate`, { method: "POST", token: admin.token });
      showSecret(rotated, "rotated");
      showError("admin-error", "");
    } catch (err) {
      showError("admin-error", explain(err, "an admin API"));
    }
    await refreshAdmin();
  }

  function optionalInt(value) {
    const text = String(value || "").trim();
    return text === "" ? undefined : Number(text);
  }

  function names(value) {
    const items = String(value || "").split(",").map((s) => s.trim()).filter(Boolean);
    return items.length ? items : undefined;
  }

  async function createKey(event) {
    event.preventDefault();
    const form = new FormData($("create-form"));
    const days = String(form.get("expires_days") || "").trim();
    const body = {
      owner: String(form.get("owner") || "").trim(),
      name: String(form.get("name") || "").trim() || undefined,
      user: String(form.get("user") || "").trim() || undefined,
      expires_in: days === "" ? undefined : Math.round(Number(days) * 86400),
      models: names(form.get("models")),
      providers: names(form.get("providers")),
      rpm: optionalInt(form.get("rpm")),
      tpm: optionalInt(form.get("tpm")),
      max_concurrent: optionalInt(form.get("max_concurrent")),
      budget_tokens: optionalInt(form.get("budget_tokens")),
    };
    $("ck-submit").disabled = true;
    try {
      const created = await api("/v1/admin/keys", { method: "POST", token: admin.token, body });
      showSecret(created, "created");
      $("create-form").reset();
      $("create-key").open = false;
      showError("admin-error", "");
    } catch (err) {
      showError("admin-error", explain(err, "an admin API"));
    } finally {
      $("ck-submit").disabled = false;
    }
    await refreshAdmin();
  }

  function showSecret(key, verb) {
    $("new-secret-title").textContent = `Key ${key.name || key.id} ${verb}: its secret`;
    $("new-secret-value").textContent = key.key || "(the server returned no secret)";
    $("new-secret").setAttribute("data-key", key.id);
    $("new-secret").hidden = false;
    $("new-secret-copy").textContent = "Copy";
    $("new-secret").scrollIntoView({ block: "nearest" });
  }

  function hideSecret() {
    $("new-secret-value").textContent = "";
    $("new-secret").hidden = true;
  }

  async function copySecret() {
    const text = $("new-secret-value").textContent;
    try {
      await navigator.clipboard.writeText(text);
      $("new-secret-copy").textContent = "Copied";
    } catch (_) {
      // No clipboard API outside secure contexts (plain http to a remote node): select it.
      const range = document.createRange();
      range.selectNodeContents($("new-secret-value"));
      const selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      $("new-secret-copy").textContent = "Selected: press Ctrl+C";
    }
  }

  async function refreshAdminUsage() {
    if (!admin.token) return;
    const by = $("admin-usage-by").value;
    const { since, until } = period(Number($("admin-usage-range").value));
    $("admin-usage-group").textContent = by.charAt(0).toUpperCase() + by.slice(1);
    try {
      const usage = await api(`/v1/admin/usage?${query({ since, until, by })}`, { token: admin.token });
      showError("admin-usage-error", "");
      renderAdminUsage(usage.data || [], by);
    } catch (err) {
      showError("admin-usage-error", explain(err, "an admin API"));
      $("admin-usage-body").replaceChildren();
    }
  }

  /** Spend at the prices set ('otela prices'), and how many requests had none. */
  function spend(row) {
    const amount = (row.spend || 0).toFixed(4);
    return row.unpriced_requests ? `${amount} (+${fmt(row.unpriced_requests)} unpriced)` : amount;
  }

  function renderAdminUsage(rows, by) {
    const body = $("admin-usage-body");
    const tokens = (r) => (r.prompt_tokens || 0) + (r.completion_tokens || 0);
    const sorted = rows.slice().sort((a, b) => tokens(b) - tokens(a));
    const most = Math.max(1, ...sorted.map(tokens));
    const keys = new Map(admin.keys.map((k) => [k.id, k]));
    body.replaceChildren(...sorted.map((row) => {
      const key = by === "key" ? keys.get(row.group) : null;
      const share = el("span", { class: "share" });
      share.style.width = `${((tokens(row) / most) * 100).toFixed(1)}%`;
      const group = row.group === null ? `(no ${by})` : row.group;
      return el("tr", { "data-group": group },
        el("th", { scope: "row" }, key ? `${key.name || "(unnamed)"} · ${key.owner}` : (row.label || group),
          key || (row.label && row.group) ? el("span", { class: "sub-line mono" }, row.group) : null),
        el("td", { class: "num" }, fmt(row.requests)),
        el("td", { class: "num" }, fmt(row.prompt_tokens)),
        el("td", { class: "num" }, fmt(row.completion_tokens)),
        el("td", { class: "num" }, fmt(row.errors)),
        el("td", { class: "num" }, ms(row.mean_latency_ms)),
        el("td", { class: "num" }, ms(row.mean_ttft_ms)),
        el("td", { class: "num" }, spend(row)),
        el("td", { class: "share-cell",
          "aria-label": `${Math.round((tokens(row) / most) * 100)} % of the largest` }, share));
    }));
    if (!sorted.length) {
      body.append(el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No requests in this period.")));
    }
    labelCells(body);
  }

  // ---------------------------------------------------------------- request log

  const requestLog = { after: null };

  /** The log form's filters (empty fields filter nothing). */
  function logFilters() {
    const filters = {};
    for (const [name, id] of [["key", "log-key"], ["team", "log-team"], ["user", "log-user"],
      ["model", "log-model"], ["status", "log-status"]]) {
      const value = $(id).value.trim();
      if (value) filters[name] = value;
    }
    return filters;
  }

  /** The newest requests (or, with ``older``, the page after the last one shown). */
  async function refreshLog(older) {
    if (!admin.token) return;
    const params = { ...logFilters(), limit: 50 };
    if (older && requestLog.after) params.after = requestLog.after;
    try {
      const page = await api(`/v1/admin/requests?${query(params)}`, { token: admin.token });
      showError("log-error", "");
      renderLog(page.data || [], older);
      requestLog.after = page.last_id;
      $("log-older").hidden = !page.has_more;
    } catch (err) {
      showError("log-error", explain(err, "an admin API"));
      if (!older) $("log-body").replaceChildren();
      $("log-older").hidden = true;
    }
  }

  function renderLog(entries, append) {
    const body = $("log-body");
    if (!append) body.replaceChildren();
    for (const entry of entries) {
      const tokens = (entry.prompt_tokens || 0) + (entry.completion_tokens || 0);
      body.append(el("tr", { "data-request": entry.id },
        el("td", {}, when(entry.finished_at)),
        el("td", {}, el("span", { class: "mono" }, entry.key_id || "—"),
          entry.team ? el("span", { class: "sub-line" }, `team ${entry.team}`) : null,
          entry.user_id ? el("span", { class: "sub-line mono" }, entry.user_id) : null),
        el("td", {}, entry.model, entry.stream ? el("span", { class: "sub-line" }, "stream") : null),
        el("td", {}, entry.provider || "—",
          el("span", { class: "sub-line mono", title: entry.node_peer || "" }, shortId(entry.node_peer || ""))),
        el("td", { class: "num" }, String(entry.status),
          entry.error ? el("span", { class: "sub-line" }, entry.error) : null),
        el("td", { class: "num" }, fmt(tokens)),
        el("td", { class: "num" }, ms(entry.latency_ms)),
        el("td", { class: "num" }, ms(entry.ttft_ms)),
        el("td", { class: "num" }, entry.spend === null || entry.spend === undefined
          ? "unpriced" : Number(entry.spend).toFixed(4)),
      ));
    }
    if (!body.children.length) {
      body.append(el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No requests match.")));
    }
    labelCells(body);
  }

  /** Every request the filters match, as a CSV file (the API streams it). */
  async function exportLog() {
    const path = `/v1/admin/requests?${query({ ...logFilters(), format: "csv" })}`;
    const response = await send(path, { token: admin.token });
    if (!response.ok) {
      showError("log-error", String(await errorFrom(response)));
      return;
    }
    const url = URL.createObjectURL(await response.blob());
    const link = el("a", { href: url, download: "requests.csv", hidden: "" });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    showError("log-error", "");
  }

  // ---------------------------------------------------------------- start

  /** A bug in this page, not an API error: say so on the page and in the console. */
  function reportBug(err) {
    console.error("otela dashboard:", err);
    showError("fed-error", `dashboard error: ${err && err.message ? err.message : err}`);
  }

  // ---------------------------------------------------------------- single sign-on

  /** Ask this node who is signed in with its session cookie (404: no SSO here). */
  async function loadSso() {
    let info;
    try {
      info = await api("/ui/session", { token: SSO });
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 404)) showError("sso-error", String(err));
      return;
    }
    if (!info.sso) return;  // no single sign-on on this ingress
    sso.available = true;
    sso.csrf = info.signed_in ? info.csrf : null;
    sso.user = info.signed_in ? info.user : null;
    $("sso").hidden = false;
    $("sso-out").hidden = Boolean(sso.user);
    $("sso-in").hidden = !sso.user;
    $("sso-expired").hidden = !info.expired;
    if (!sso.user) return;
    const user = sso.user;
    $("sso-name").textContent = user.name || user.email || user.id;
    $("sso-facts").textContent = [user.email, `team: ${user.team || "none"}`,
      user.admin ? "admin" : "not an admin"].filter(Boolean).join(" · ");
    await refreshMyKeys();
    $("sso-team-keys").replaceChildren(...(info.team_keys || []).map((k) => {
      const li = document.createElement("li");
      li.dataset.key = k.id;
      li.textContent = `${k.id} ${k.name ? `(${k.name}) ` : ""}owner ${k.owner}: ${k.status}`;
      return li;
    }));
    if (user.admin && !admin.token) {
      admin.token = SSO;
      showAdmin(true);
      if (currentTab() === "admin") await refreshAdmin();
    }
  }

  // The signed-in user's own keys (GET /ui/keys): listed always, revoked by them, and
  // created by them where the operator allows it (docs/ingress.md#keys-of-single-sign-on-users).
  const mine = { arming: null };

  async function refreshMyKeys() {
    let listing;
    try {
      listing = await api("/ui/keys", { token: SSO });
    } catch (err) {
      showError("my-keys-error", String(err));
      return;
    }
    showError("my-keys-error", "");
    const keys = listing.data || [];
    $("my-keys-none").hidden = keys.length > 0;
    $("my-key-form").hidden = !listing.can_create;
    $("my-keys").replaceChildren(...keys.map((key) => {
      const [status, tone] = keyStatus(key);
      const used = key.used_tokens === undefined ? "" : ` · ${fmt(key.used_tokens)} tokens used`;
      const item = el("li", { "data-key": key.id },
        el("span", {}, key.name || "(unnamed)"), " ",
        el("span", { class: "mono" }, key.id), " ", pill(status, tone),
        el("span", { class: "muted" }, `${key.scheduling && key.scheduling.team
          ? ` · team ${key.scheduling.team}` : ""}${used}`));
      if (!key.revoked_at) {
        const armed = mine.arming === key.id;
        const button = el("button", { type: "button", class: "danger", "data-action": "revoke",
          "aria-label": `${armed ? "Confirm: " : ""}Revoke key ${key.name || key.id}` },
          armed ? "Confirm revoke" : "Revoke");
        button.addEventListener("click", () => revokeMyKey(key).catch(reportBug));
        item.append(" ", button);
      }
      return item;
    }));
  }

  /** Two clicks revoke a key, as in the admin view: the first arms the button. */
  async function revokeMyKey(key) {
    if (mine.arming !== key.id) {
      mine.arming = key.id;
      await refreshMyKeys();
      return;
    }
    mine.arming = null;
    try {
      await api(`/ui/keys/${encodeURIComponent(key.id)}/revoke`, { method: "POST", token: SSO });
    } catch (err) {
      showError("my-keys-error", String(err));
    }
    await refreshMyKeys();
  }

  async function createMyKey(event) {
    event.preventDefault();
    const name = $("my-key-name").value.trim();
    $("my-key-create").disabled = true;
    try {
      const made = await api("/ui/keys", { method: "POST", token: SSO,
        body: name ? { name } : {} });
      $("my-key-secret-value").textContent = made.key || "(the server returned no secret)";
      $("my-key-secret").setAttribute("data-key", made.id);
      $("my-key-secret").hidden = false;
      $("my-key-form").reset();
      showError("my-keys-error", "");
    } catch (err) {
      showError("my-keys-error", String(err));
    } finally {
      $("my-key-create").disabled = false;
    }
    await refreshMyKeys();
  }

  function hideMySecret() {
    $("my-key-secret-value").textContent = "";
    $("my-key-secret").hidden = true;
  }

  async function signOutSso() {
    try {
      await api("/ui/logout", { method: "POST", token: SSO });
    } catch (err) {
      showError("sso-error", String(err));
      return;
    }
    location.replace("/ui#account");
    location.reload();
  }

  function start() {
    setupTabs();
    $("key-form").addEventListener("submit", (e) => signInKey(e).catch(reportBug));
    $("key-signout").addEventListener("click", signOutKey);
    $("usage-range").addEventListener("change", () => refreshUsage().catch(reportBug));
    window.addEventListener("resize", () => {
      clearTimeout(chart.resizeTimer);
      chart.resizeTimer = setTimeout(() => {
        if (chart.last && !$("usage-figure").hidden) drawUsage(...chart.last);
      }, 150);
    });
    $("chat-form").addEventListener("submit", (e) => sendChat(e).catch(reportBug));
    $("chat-input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("chat-form").requestSubmit();
    });
    $("chat-stop").addEventListener("click", () => chat.controller && chat.controller.abort());
    $("chat-clear").addEventListener("click", clearChat);
    $("admin-form").addEventListener("submit", (e) => signInAdmin(e).catch(reportBug));
    $("admin-signout").addEventListener("click", signOutAdmin);
    $("create-form").addEventListener("submit", (e) => createKey(e).catch(reportBug));
    $("new-secret-copy").addEventListener("click", () => copySecret().catch(reportBug));
    $("new-secret-dismiss").addEventListener("click", hideSecret);
    $("admin-usage-by").addEventListener("change", () => refreshAdminUsage().catch(reportBug));
    $("log-form").addEventListener("submit", (e) => {
      e.preventDefault();
      refreshLog(false).catch(reportBug);
    });
    $("log-older").addEventListener("click", () => refreshLog(true).catch(reportBug));
    $("log-export").addEventListener("click", () => exportLog().catch(reportBug));
    $("keys-search").addEventListener("input", () => { admin.page = 0; renderKeys(admin.keys); });
    $("keys-prev").addEventListener("click", () => { admin.page -= 1; renderKeys(admin.keys); });
    $("keys-next").addEventListener("click", () => { admin.page += 1; renderKeys(admin.keys); });
    $("admin-usage-range").addEventListener("change", () => refreshAdminUsage().catch(reportBug));

    onShow.federation = () => refreshFederation().catch(reportBug);
    onShow.account = () => refreshAccount().catch(reportBug);
    onShow.admin = () => refreshAdmin().catch(reportBug);
    $("sso-signout").addEventListener("click", () => signOutSso().catch(reportBug));
    $("my-key-form").addEventListener("submit", (e) => createMyKey(e).catch(reportBug));
    $("my-key-secret-dismiss").addEventListener("click", hideMySecret);

    account.key = sessionStorage.getItem(STORE.key);
    admin.token = sessionStorage.getItem(STORE.admin);
    showAccount(Boolean(account.key));
    showAdmin(Boolean(admin.token));
    setChatBusy(false);
    const initial = location.hash.slice(1);
    selectTab(TABS.includes(initial) ? initial : "federation");
    if (currentTab() !== "federation") refreshFederation().catch(reportBug);
    scheduleFederation();
    loadSso().catch(reportBug);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
