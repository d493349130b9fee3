// OpenTela dashboard: catalog, node map, playground, keys, usage and workload. Plain JS, no external assets.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const short = (id) => (id ? "…" + String(id).slice(-8) : "-");
const fmtInt = (n) => (n == null ? "-" : Number(n).toLocaleString());
const fmtMs = (n) => (n == null ? "-" : n < 1000 ? `${Math.round(n)} ms` : `${(n / 1000).toFixed(2)} s`);
const ago = (ts) => {
  if (!ts) return "-";
  const s = Math.max(0, Date.now() / 1000 - ts);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(ts * 1000).toISOString().slice(0, 10);
};

const store = {
  get key() { return localStorage.getItem("otela.key") || ""; },
  set key(v) { v ? localStorage.setItem("otela.key", v) : localStorage.removeItem("otela.key"); },
  get admin() { return sessionStorage.getItem("otela.admin") || ""; },
  set admin(v) { v ? sessionStorage.setItem("otela.admin", v) : sessionStorage.removeItem("otela.admin"); },
};

async function api(path, { token, method = "GET", body } = {}) {
  const headers = {};
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (!resp.ok) {
    const msg = data && data.error ? data.error.message : `${resp.status} ${resp.statusText}`;
    const err = new Error(msg);
    err.status = resp.status;
    throw err;
  }
  return data;
}

// The user's login (OpenID Connect), when this frontend offers one: `me` is /api/me while the session lasts.
const session = { offered: false, me: null };
// The mesh views need a credential: the admin token of this tab, else the key kept in this browser, else the login
// session (its cookie goes with every request to this origin).
const meshToken = () => store.admin || store.key;
const canSeeMesh = () => Boolean(meshToken() || session.me);
const meshApi = (path) => api(path, { token: meshToken() });
const NEEDS_KEY = "Enter your API key above, log in, or unlock the Keys tab with the admin token to see the mesh.";

// ---- tabs -------------------------------------------------------------------------------------------------
let current = "models";
function show(tab) {
  current = tab;
  $$(".tabs button").forEach((b) => b.classList.toggle("active", b.dataset.tab === tab));
  $$(".view").forEach((v) => v.classList.toggle("active", v.id === `view-${tab}`));
  if (location.hash !== `#${tab}`) history.replaceState(null, "", `#${tab}`);
  refresh();
}
$$(".tabs button").forEach((b) => b.addEventListener("click", () => show(b.dataset.tab)));

// ---- mesh: catalog and nodes --------------------------------------------------------------------------------
function hardwareText(hw) {
  if (!hw) return "-";
  const gpus = hw.gpus || [];
  if (gpus.length) {
    const groups = {};
    gpus.forEach((g) => {
      const label = `${g.name || "GPU"}${g.memory_mib ? ` ${Math.round(g.memory_mib / 1024)} GiB` : ""}`;
      groups[label] = (groups[label] || 0) + 1;
    });
    return Object.entries(groups).map(([l, n]) => `${n}× ${l}`).join(", ");
  }
  const cpu = typeof hw.cpu === "object" && hw.cpu ? hw.cpu.model : hw.cpu;
  const threads = hw.cpu_threads || (hw.cpu && hw.cpu.threads);
  const ram = hw.ram_mib ? `, ${Math.round(hw.ram_mib / 1024)} GiB RAM` : "";
  return `CPU ${cpu || "?"}${threads ? ` (${threads} threads)` : ""}${ram}`;
}

// A replica's own state as its engine says it (`replica_state`, serving when it says nothing). A tensor-parallel
// engine that lost a rank says `reconfiguring` while it moves onto the ranks it has left: it is alive (its streams
// go on, new requests wait), so it is shown by that state rather than as down.
const SERVING = "serving";
const replicaState = (s) => (s && typeof s.replica_state === "string" && s.replica_state) || SERVING;
function tpText(tp) {
  // `tp_degree` and the healthy ranks, from a replica of /v1/models (ranks as a list) or a record's settings.
  if (!tp || tp.tp_degree == null) return "";
  const ranks = Array.isArray(tp.tp_ranks) ? tp.tp_ranks.join(", ") : tp.tp_ranks;
  return `TP ${tp.tp_degree}${ranks ? ` · ranks ${ranks}` : ""}`;
}
function stateBadge(lifecycle, settingsOrReplica) {
  const state = replicaState(settingsOrReplica);
  if (lifecycle !== "SERVING" || state === SERVING) return `<span class="badge ${esc(lifecycle)}">${esc(lifecycle)}</span>`;
  const kind = state === "reconfiguring" ? "RECONFIGURING" : "replica-state";
  return `<span class="badge ${kind}">${esc(state.toUpperCase())}</span>`;
}

function enginesText(r) {
  // A node's engines, with the memory each takes and what the node lends, where they share it.
  const models = r.models || [];
  if (!models.length) return "-";
  const parts = models.map((m) => {
    const mib = m.settings && m.settings.memory_mib;
    const tp = tpText(m.settings);
    const notes = [mib ? `${mib} MiB` : "", tp].filter(Boolean).join(", ");
    return notes ? `${m.id} (${notes})` : m.id;
  });
  const lent = r.hardware && r.hardware.engine_memory_mib;
  const used = models.reduce((sum, m) => sum + ((m.settings && m.settings.memory_mib) || 0), 0);
  return parts.join(", ") + (lent && used ? ` · ${used} of ${lent} MiB` : "");
}

async function loadModels() {
  const box = $("#models");
  try {
    if (!canSeeMesh()) { box.innerHTML = `<p class="muted needs-key">${esc(NEEDS_KEY)}</p>`; return; }
    const [listing, serverless] = await Promise.all([
      meshApi("/api/mesh/models"),
      // Older ingresses have no serverless view: the catalog then shows what is served.
      meshApi("/api/mesh/serverless").then((r) => r.models || {}, () => ({})),
    ]);
    // An alias entry (`alias_for` its target) carries a copy of its target's replicas: it gets no card of its
    // own, its target's card names it instead.
    const entries = listing.data || [];
    const models = entries.filter((m) => !m.alias_for);
    const aliasesOf = {};
    entries.filter((m) => m.alias_for).forEach((a) => { (aliasesOf[a.alias_for] = aliasesOf[a.alias_for] || []).push(a); });
    fillModelSelect(models, entries.filter((m) => m.alias_for));
    const served = new Set(models.map((m) => m.id));
    const cold = Object.keys(serverless).filter((id) => !served.has(id)).sort();
    const lazy = Object.keys(serverless).length;
    const aliasCount = entries.length - models.length;
    $("#models-summary").textContent = `${models.length} model${models.length === 1 ? "" : "s"} served` +
      (aliasCount ? `, ${aliasCount} alias${aliasCount === 1 ? "" : "es"}` : "") +
      (lazy ? `, ${lazy} serverless` : "");
    if (!models.length && !cold.length) { box.innerHTML = `<p class="muted">No model is being served right now.</p>`; return; }
    const lazyLine = (id) => {
      const s = serverless[id];
      if (!s) return "";
      const last = s.last_cold_start_s == null ? "no cold start yet" : `last cold start ${s.last_cold_start_s.toFixed(1)} s`;
      return `<div class="sub serverless"><span class="badge serverless-${esc(s.state)}">serverless · ${esc(s.state)}</span> ${esc(last)}</div>`;
    };
    const coldCards = cold.map((id) => `<article class="card model-card" data-model="${esc(id)}">
        <h3>${esc(id)}</h3>${lazyLine(id)}
        <div class="sub">no replica: started on the first request</div></article>`).join("");
    const aliasLine = (m) => {
      const names = (aliasesOf[m.id] || []).map((a) => `<span class="mono" data-alias="${esc(a.id)}">${esc(a.id)}</span>${a.default ? " (default)" : ""}`);
      return names.length ? `<div class="sub aliases">also: ${names.join(", ")}</div>` : "";
    };
    box.innerHTML = coldCards + models.map((m) => {
      m.replicas = m.replicas || [];  // a split model lists block servers instead
      const live = m.replicas.filter((r) => r.state === "SERVING" && !r.suspected);
      const healthy = live.filter((r) => replicaState(r) === SERVING).length;
      const others = {};
      live.forEach((r) => { const st = replicaState(r); if (st !== SERVING) others[st] = (others[st] || 0) + 1; });
      const othersText = Object.entries(others).map(([st, n]) => `, ${n} ${st}`).join("");
      const replicas = m.replicas.map((r) => `
        <div class="replica" data-session="${esc(r.session_id)}" data-replica-state="${esc(r.replica_state || "")}">
          <span class="k">state</span><span>${stateBadge(r.state, r)}
            <span class="badge ${r.suspected ? "suspected" : "healthy"}">${r.suspected ? "suspected" : "healthy"}</span></span>
          ${tpText(r) ? `<span class="k">tensor parallel</span><span class="tp">${esc(tpText(r))}</span>` : ""}
          <span class="k">provider</span><span>${esc(r.provider_id)}</span>
          <span class="k">node</span><span class="mono" title="${esc(r.peer_id)}">${esc(short(r.peer_id))}</span>
          <span class="k">hardware</span><span>${esc(hardwareText(r.hardware))}</span>
          <span class="k">engine</span><span>${esc(r.engine || "-")}${Object.keys(r.settings || {}).length ? ` <span class="muted mono">${esc(JSON.stringify(r.settings))}</span>` : ""}</span>
        </div>`).join("");
      return `<article class="card model-card" data-model="${esc(m.id)}">
        <h3>${esc(m.id)}${m.default ? ` <span class="badge default">default</span>` : ""}</h3>${aliasLine(m)}
        <div class="sub">${healthy} of ${m.replicas.length} replica${m.replicas.length === 1 ? "" : "s"} healthy${esc(othersText)}</div>${lazyLine(m.id)}
        ${replicas}</article>`;
    }).join("");
  } catch (e) {
    box.innerHTML = `<p class="msg error">Cannot read the catalog: ${esc(e.message)}</p>`;
  }
}

async function loadNodes() {
  const body = $("#nodes tbody");
  try {
    if (!canSeeMesh()) { body.innerHTML = `<tr><td colspan="7" class="muted needs-key">${esc(NEEDS_KEY)}</td></tr>`; return; }
    const [table, peers] = await Promise.all([meshApi("/api/mesh/table"), meshApi("/api/mesh/peers")]);
    const suspected = new Set(peers.filter((p) => p.suspected).map((p) => p.peer_id));
    const order = { SERVING: 0, JOIN: 1, DOWN: 2, LEFT: 3 };
    table.sort((a, b) => (order[a.lifecycle] - order[b.lifecycle]) || String(a.provider_id).localeCompare(b.provider_id));
    const live = table.filter((r) => r.lifecycle === "SERVING" || r.lifecycle === "JOIN").length;
    $("#nodes-summary").textContent = `${table.length} records, ${live} live`;
    body.innerHTML = table.map((r) => {
      const health = r.lifecycle === "LEFT" || r.lifecycle === "DOWN" ? "-" :
        suspected.has(r.peer_id) ? `<span class="badge suspected">suspected</span>` : `<span class="badge healthy">healthy</span>`;
      const roles = (r.roles || []).length ? ` <span class="muted">(${esc(r.roles.join(", "))})</span>` : "";
      return `<tr data-peer="${esc(r.peer_id)}" data-session="${esc(r.session_id)}">
        <td data-label="Node" class="mono" title="${esc(r.peer_id)}">${esc(short(r.peer_id))}${roles}</td>
        <td data-label="Provider">${esc(r.provider_id)}</td>
        <td data-label="Lifecycle">${stateBadge(r.lifecycle, { replica_state: (r.models || []).map((m) => replicaState(m.settings)).find((st) => st !== SERVING) })}</td>
        <td data-label="Health">${health}</td>
        <td data-label="Hardware">${esc(hardwareText(r.hardware))}</td>
        <td data-label="Models">${esc(enginesText(r))}</td>
        <td data-label="Updated">${esc(ago(r.updated_at))}</td></tr>`;
    }).join("") || `<tr><td colspan="7" class="muted">No nodes.</td></tr>`;
  } catch (e) {
    body.innerHTML = `<tr><td colspan="7" class="msg error">Cannot read the node map: ${esc(e.message)}</td></tr>`;
  }
}

async function loadHealth() {
  const box = $("#health");
  try {
    if (!canSeeMesh()) { box.className = "health"; $("#health-text").textContent = "no key"; return; }
    const h = await meshApi("/api/mesh/health");
    box.className = "health ok";
    $("#health-text").textContent = `ingress ${h.status === "ok" ? "up" : h.status} · ${h.nodes_known} nodes`;
  } catch (e) {
    box.className = "health bad";
    $("#health-text").textContent = "ingress unreachable";
  }
}

// ---- your key --------------------------------------------------------------------------------------------
function keyStatus(text, bad) {
  const el = $("#key-status");
  el.textContent = text;
  el.style.color = bad ? "var(--bad)" : "";
}
async function checkKey() {
  if (!store.key) { keyStatus("No key yet. The catalog, node map, playground and usage need one."); return null; }
  try {
    const me = await api("/v1/me", { token: store.key });
    keyStatus(`Using key ${me.prefix}… ${me.name ? `(${me.name})` : ""} — ${me.state}.`);
    return me;
  } catch (e) {
    keyStatus(`This key does not work: ${e.message}`, true);
    return null;
  }
}
$("#key-save").addEventListener("click", () => { store.key = $("#key-input").value.trim(); $("#key-input").value = ""; checkKey().then(refresh); });
$("#key-forget").addEventListener("click", () => { store.key = ""; checkKey(); refresh(); });

// ---- playground -------------------------------------------------------------------------------------------
const chat = { messages: [], busy: false, controller: null };
function fillModelSelect(models, aliases = []) {
  // Served ids, then aliases as "alias → id"; without an earlier choice, the ingress's default model is chosen.
  const sel = $("#chat-model");
  const keep = sel.value;
  const choices = [...models.map((m) => [m.id, m.id]), ...aliases.map((a) => [a.id, `${a.id} → ${a.alias_for}`])];
  const shown = $$("option", sel).map((o) => `${o.value}=${o.textContent}`).join("|");
  if (choices.map(([v, t]) => `${v}=${t}`).join("|") === shown) return;
  sel.innerHTML = choices.map(([v, t]) => `<option value="${esc(v)}">${esc(t)}</option>`).join("") || `<option value="">no model served</option>`;
  const fallback = [...models, ...aliases].find((m) => m.default);
  if (choices.some(([v]) => v === keep)) sel.value = keep;
  else if (fallback) sel.value = fallback.id;
}
function addMessage(role, text) {
  const el = document.createElement("div");
  el.className = `msg ${role}`;
  el.textContent = text;
  $("#chat-log").appendChild(el);
  $("#chat-log").scrollTop = $("#chat-log").scrollHeight;
  return el;
}
async function send(prompt) {
  if (!store.key) { addMessage("error", "Paste your API key above to use the playground."); return; }
  const model = $("#chat-model").value;
  if (!model) { addMessage("error", "No model is being served."); return; }
  chat.messages.push({ role: "user", content: prompt });
  addMessage("user", prompt);
  const out = addMessage("assistant streaming", "");
  chat.busy = true;
  $("#chat-send").disabled = true;
  chat.controller = new AbortController();
  const started = performance.now();
  let first = null, chunks = 0, text = "", usage = null;
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      signal: chat.controller.signal,
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${store.key}` },
      body: JSON.stringify({
        model, messages: chat.messages, stream: true, stream_options: { include_usage: true },
        max_tokens: Number($("#chat-max").value) || 128, temperature: Number($("#chat-temp").value),
      }),
    });
    if (!resp.ok) {
      let msg = `${resp.status}`;
      try { msg = (await resp.json()).error.message; } catch { /* keep the status */ }
      throw new Error(msg);
    }
    const node = resp.headers.get("X-Otela-Node"), provider = resp.headers.get("X-Otela-Provider");
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
      let end;
      while ((end = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, end);
        buf = buf.slice(end + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
        if (!data || data === "[DONE]") continue;
        let obj;
        try { obj = JSON.parse(data); } catch { continue; }
        if (obj.error) throw new Error(obj.error.message);
        if (obj.usage) usage = obj.usage;
        for (const c of obj.choices || []) {
          const piece = c.delta && c.delta.content;
          if (piece) {
            if (first === null) first = performance.now();
            chunks += 1;
            text += piece;
            out.textContent = text;
            $("#chat-log").scrollTop = $("#chat-log").scrollHeight;
          }
        }
      }
    }
    chat.messages.push({ role: "assistant", content: text });
    const secs = (performance.now() - (first || started)) / 1000;
    const outTokens = usage ? usage.completion_tokens : chunks;
    $("#chat-meta").textContent = `${model} · node ${short(node)} (provider ${provider || "?"}) · first token ${fmtMs(first ? first - started : null)}`
      + ` · ${outTokens} tokens${secs > 0 ? `, ${(outTokens / secs).toFixed(1)} tokens/s` : ""}${usage ? ` · ${usage.prompt_tokens} prompt tokens` : ""}`;
  } catch (e) {
    chat.messages.pop();
    if (e.name !== "AbortError") addMessage("error", `Request failed: ${e.message}`);
  } finally {
    out.classList.remove("streaming");
    if (!text) out.remove();
    chat.busy = false;
    $("#chat-send").disabled = false;
  }
}
$("#chat-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const prompt = $("#chat-input").value.trim();
  if (!prompt || chat.busy) return;
  $("#chat-input").value = "";
  send(prompt);
});
$("#chat-input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("#chat-form").requestSubmit(); }
});
$("#chat-clear").addEventListener("click", () => {
  if (chat.controller) chat.controller.abort();
  chat.messages = [];
  $("#chat-log").innerHTML = "";
  $("#chat-meta").textContent = "";
});

// ---- keys -------------------------------------------------------------------------------------------------
function limitsText(k) {
  const parts = [];
  if (k.budget_tokens != null) parts.push(`${fmtInt(k.budget_tokens)} tok/${k.budget_period}`);
  if (k.budget_requests != null) parts.push(`${fmtInt(k.budget_requests)} req/${k.budget_period}`);
  if (k.rpm_limit != null) parts.push(`${k.rpm_limit} rpm`);
  if (k.tpm_limit != null) parts.push(`${fmtInt(k.tpm_limit)} tpm`);
  if (k.allowed_models) parts.push(`models: ${k.allowed_models.join(", ")}`);
  if (k.trusted_providers) parts.push(`providers: ${k.trusted_providers.join(", ")}`);
  if (!k.log_content) parts.push("not in trace");
  return parts.join(" · ") || "unlimited";
}
async function loadKeys() {
  await loadSelf();
  const me = store.key ? await checkKey() : null;
  const mine = $("#my-key");
  if (me) {
    mine.classList.remove("hidden");
    mine.innerHTML = `<h2>Your key</h2><p><span class="mono">${esc(me.prefix)}…</span> ${esc(me.name)}
      <span class="badge ${esc(me.state)}">${esc(me.state)}</span></p><p class="hint">${esc(limitsText(me))}</p>`;
  } else mine.classList.add("hidden");
  if (!store.admin) { $("#admin-area").classList.add("hidden"); return; }
  try {
    const keys = (await api("/admin/keys", { token: store.admin })).data;
    $("#admin-status").textContent = "Management unlocked for this browser tab.";
    $("#admin-area").classList.remove("hidden");
    $("#keys-table tbody").innerHTML = keys.map((k) => `
      <tr class="key-row" data-id="${esc(k.id)}" data-name="${esc(k.name)}">
        <td data-label="Name">${esc(k.name || "-")}</td><td data-label="Prefix" class="mono">${esc(k.prefix)}…</td>
        <td data-label="State"><span class="badge ${esc(k.state)}">${esc(k.state)}</span></td>
        <td data-label="Limits">${esc(limitsText(k))}</td><td data-label="Last used">${esc(ago(k.last_used_at))}</td>
        <td class="row actions-cell">${k.state === "revoked" ? "" : `<button class="secondary rotate-btn">Rotate</button><button class="danger revoke-btn">Revoke</button>`}</td>
      </tr>`).join("") || `<tr><td colspan="6" class="muted">No keys yet.</td></tr>`;
  } catch (e) {
    $("#admin-area").classList.add("hidden");
    $("#admin-status").textContent = `Admin token refused: ${e.message}`;
    $("#admin-status").style.color = "var(--bad)";
  }
}
function showSecret(title, secret, where = "#new-secret") {
  const box = $(where);
  box.classList.remove("hidden");
  box.innerHTML = `<strong>${esc(title)}</strong><code class="secret-value">${esc(secret)}</code>
    <div class="row"><button class="secondary copy-secret">Copy</button><button class="ghost use-secret">Use in this browser</button></div>
    <p class="hint">This is the only time the secret is shown. Only its hash is stored.</p>`;
  if (where === "#new-secret") $(".secret-value", box).id = "new-secret-value";
  $(".copy-secret", box).addEventListener("click", () => navigator.clipboard && navigator.clipboard.writeText(secret));
  $(".use-secret", box).addEventListener("click", () => { store.key = secret; checkKey(); refresh(); });
}
$("#admin-save").addEventListener("click", () => {
  store.admin = $("#admin-token").value.trim();
  $("#admin-token").value = "";
  $("#admin-status").style.color = "";
  loadKeys();
});
$("#create-key-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const f = new FormData(ev.target);
  const num = (n) => (f.get(n) === "" || f.get(n) == null ? null : Number(f.get(n)));
  const list = (n) => (f.get(n) ? f.get(n).split(",").map((s) => s.trim()).filter(Boolean) : null);
  const body = {
    name: f.get("name") || "", budget_tokens: num("budget_tokens"), budget_requests: num("budget_requests"),
    budget_period: f.get("budget_period"), rpm_limit: num("rpm_limit"), tpm_limit: num("tpm_limit"),
    allowed_models: list("allowed_models"), trusted_providers: list("trusted_providers"),
    log_content: f.get("log_content") === "on",
  };
  if (num("expires_in_days")) body.expires_in_days = num("expires_in_days");
  try {
    const made = await api("/admin/keys", { token: store.admin, method: "POST", body });
    showSecret(`Key ${made.key.prefix}… created${made.key.name ? ` for ${made.key.name}` : ""}`, made.secret);
    ev.target.reset();
    loadKeys();
  } catch (e) {
    showSecret("Could not create the key", e.message);
  }
});
$("#keys-table").addEventListener("click", async (ev) => {
  const row = ev.target.closest(".key-row");
  if (!row) return;
  const id = row.dataset.id;
  if (ev.target.classList.contains("revoke-btn")) {
    if (!confirm(`Revoke key ${row.dataset.name || id}? Requests with it fail from now on.`)) return;
    await api(`/admin/keys/${id}/revoke`, { token: store.admin, method: "POST" });
    loadKeys();
  } else if (ev.target.classList.contains("rotate-btn")) {
    const made = await api(`/admin/keys/${id}/rotate`, { token: store.admin, method: "POST" });
    showSecret(`New secret for ${made.key.name || made.key.prefix}`, made.secret);
    loadKeys();
  }
});

// ---- login and your own keys ------------------------------------------------------------------------------
async function loadSession() {
  // Who is logged in (null when nobody, or the session ended), then the header's Log in / Log out.
  if (session.offered) {
    try { session.me = await api("/api/me"); } catch (e) { session.me = null; }
  }
  const me = session.me;
  $("#account").classList.toggle("hidden", !session.offered);
  $("#login-button").classList.toggle("hidden", Boolean(me));
  $("#logout-button").classList.toggle("hidden", !me);
  $("#account-name").classList.toggle("hidden", !me);
  if (me) {
    const u = me.user;
    $("#account-name").textContent = u.name || u.email || u.subject;
    $("#account-name").title = `${u.email || u.subject} (${u.issuer})`;
  }
  return me;
}
$("#logout-button").addEventListener("click", async () => {
  let next = "/";
  try { next = (await api("/auth/logout", { method: "POST" })).redirect || "/"; } catch { /* the session is gone anyway */ }
  session.me = null;
  location.href = next;
});
function groupText(active, limits) {
  const scope = limits.group === null ? "the default limits" : limits.group === "*" ? "the limits for everyone" : `the limits of group ${limits.group}`;
  return `${active} of ${limits.max_keys} key${limits.max_keys === 1 ? "" : "s"} in use (${scope}); each new key: ${limitsText({ ...limits, log_content: true })}`;
}
async function loadSelf() {
  const offered = session.offered;
  const me = offered ? await loadSession() : null;
  $("#login-panel").classList.toggle("hidden", !offered || Boolean(me));
  $("#self-area").classList.toggle("hidden", !me);
  if (!me) return;
  const u = me.user;
  $("#self-summary").innerHTML = `<h2>Your keys</h2><p>Logged in as <strong>${esc(u.name || u.subject)}</strong>
    ${u.email ? `<span class="muted">${esc(u.email)}</span>` : ""}${u.groups.length ? ` · groups ${esc(u.groups.join(", "))}` : ""}</p>
    <p class="hint" id="self-limits">${esc(groupText(me.active_keys, me.limits))}</p>`;
  try {
    const keys = (await api("/api/me/keys")).data;
    $("#self-keys-table tbody").innerHTML = keys.map((k) => `
      <tr class="self-key-row" data-id="${esc(k.id)}" data-name="${esc(k.name)}" data-state="${esc(k.state)}">
        <td data-label="Name">${esc(k.name || "-")}</td><td data-label="Prefix" class="mono">${esc(k.prefix)}…</td>
        <td data-label="State"><span class="badge ${esc(k.state)}">${esc(k.state)}</span></td>
        <td data-label="Limits">${esc(limitsText(k))}</td><td data-label="Last used">${esc(ago(k.last_used_at))}</td>
        <td class="row actions-cell">${k.state === "revoked" ? "" : `<button class="secondary self-rotate">Rotate</button><button class="danger self-revoke">Revoke</button>`}</td>
      </tr>`).join("") || `<tr><td colspan="6" class="muted">No keys yet: create one above.</td></tr>`;
  } catch (e) {
    $("#self-error").textContent = `Cannot read your keys: ${e.message}`;
  }
}
function selfError(text) {
  $("#self-error").textContent = text;
  $("#self-error").classList.toggle("bad", Boolean(text));
}
$("#self-create-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const f = new FormData(ev.target);
  const body = { name: f.get("name") || "" };
  if (f.get("expires_in_days")) body.expires_in_days = Number(f.get("expires_in_days"));
  selfError("");
  try {
    const made = await api("/api/me/keys", { method: "POST", body });
    showSecret(`Key ${made.key.prefix}… created${made.key.name ? ` for ${made.key.name}` : ""}`, made.secret, "#self-secret");
    ev.target.reset();
  } catch (e) {
    selfError(e.message);
    if (e.status === 401) session.me = null;
  }
  loadSelf();
});
$("#self-keys-table").addEventListener("click", async (ev) => {
  const row = ev.target.closest(".self-key-row");
  if (!row) return;
  const id = row.dataset.id;
  selfError("");
  try {
    if (ev.target.classList.contains("self-revoke")) {
      if (!confirm(`Revoke your key ${row.dataset.name || id}? Requests with it fail from now on.`)) return;
      await api(`/api/me/keys/${id}/revoke`, { method: "POST" });
    } else if (ev.target.classList.contains("self-rotate")) {
      const made = await api(`/api/me/keys/${id}/rotate`, { method: "POST" });
      showSecret(`New secret for ${made.key.name || made.key.prefix}; the old one no longer works`, made.secret, "#self-secret");
    } else return;
  } catch (e) {
    selfError(e.message);
  }
  loadSelf();
});

// ---- usage ------------------------------------------------------------------------------------------------
function chart(series, bucket, hours) {
  const box = $("#usage-chart");
  // Drawn at the box's own width, so labels keep their size on a phone.
  const W = Math.max(300, box.clientWidth || 900), H = 220, L = 52, B = 26, T = 10;
  const now = Date.now() / 1000;
  const start = Math.floor((now - hours * 3600) / bucket) * bucket;
  const n = Math.max(1, Math.ceil((now - start) / bucket));
  const byT = Object.fromEntries(series.map((p) => [p.t, p]));
  const pts = Array.from({ length: n }, (_, i) => byT[start + i * bucket] || { t: start + i * bucket, input_tokens: 0, output_tokens: 0 });
  const max = Math.max(1, ...pts.map((p) => p.input_tokens + p.output_tokens));
  const bw = (W - L - 8) / n;
  const y = (v) => H - B - (v / max) * (H - B - T);
  const label = (t) => {
    const d = new Date(t * 1000);
    return bucket >= 86400 ? d.toISOString().slice(5, 10) : d.toTimeString().slice(0, 5);
  };
  const every = Math.max(1, Math.ceil(n / Math.max(3, Math.floor(W / 110))));
  let bars = "";
  pts.forEach((p, i) => {
    const x = L + i * bw + bw * 0.12, w = Math.max(1, bw * 0.76);
    const total = p.input_tokens + p.output_tokens;
    if (total) {
      bars += `<rect x="${x}" y="${y(total)}" width="${w}" height="${y(p.output_tokens) - y(total)}" fill="var(--in)"><title>${label(p.t)}: ${p.input_tokens} input tokens</title></rect>`;
      bars += `<rect x="${x}" y="${y(p.output_tokens)}" width="${w}" height="${H - B - y(p.output_tokens)}" fill="var(--out)"><title>${label(p.t)}: ${p.output_tokens} output tokens</title></rect>`;
    }
    if (i % every === 0) bars += `<text x="${x + w / 2}" y="${H - 8}" text-anchor="middle">${label(p.t)}</text>`;
  });
  const ticks = [0, 0.5, 1].map((f) => `<line class="axis" x1="${L}" x2="${W - 4}" y1="${y(max * f)}" y2="${y(max * f)}"/>
    <text x="${L - 6}" y="${y(max * f) + 4}" text-anchor="end">${fmtInt(Math.round(max * f))}</text>`).join("");
  box.innerHTML = `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="tokens over time">${ticks}${bars}</svg>
    <div class="legend"><span><i class="in"></i>input tokens</span><span><i class="out"></i>output tokens</span></div>`;
}
async function loadUsage() {
  const hours = Number($("#usage-hours").value);
  let series, bucket, rows, scope;
  try {
    if (store.admin) {
      const [s, r] = await Promise.all([
        api(`/admin/usage/series?hours=${hours}`, { token: store.admin }),
        api(`/admin/usage/rows?limit=50`, { token: store.admin }),
      ]);
      series = s.data; bucket = s.bucket_s; rows = r.data; scope = "all keys (admin)";
    } else if (session.me) {
      const u = await api(`/api/me/usage?hours=${hours}&limit=50`);
      series = u.series; bucket = u.bucket_s; rows = u.rows;
      scope = `your ${u.keys} key${u.keys === 1 ? "" : "s"} (${session.me.user.name || session.me.user.subject})`;
    } else if (store.key) {
      const u = await api(`/v1/usage?hours=${hours}&limit=50`, { token: store.key });
      series = u.series; bucket = u.bucket_s; rows = u.rows; scope = `key ${u.key.prefix}…`;
    } else {
      $("#usage-scope").textContent = "";
      $("#usage-stats").innerHTML = `<p class="muted">Paste your API key above, log in, or unlock management in Keys to see usage.</p>`;
      $("#usage-chart").innerHTML = ""; $("#usage-rows tbody").innerHTML = "";
      return;
    }
  } catch (e) {
    $("#usage-stats").innerHTML = `<p class="msg error">Cannot read usage: ${esc(e.message)}</p>`;
    return;
  }
  $("#usage-scope").textContent = scope;
  const sum = (f) => series.reduce((a, p) => a + p[f], 0);
  $("#usage-stats").innerHTML = [["requests", sum("requests")], ["input tokens", sum("input_tokens")],
    ["output tokens", sum("output_tokens")]].map(([l, v]) => `<div class="stat"><div class="v">${fmtInt(v)}</div><div class="l">${l}</div></div>`).join("");
  chart(series, bucket, hours);
  $("#usage-rows tbody").innerHTML = rows.map((r) => `<tr>
      <td data-label="When">${esc(ago(r.started_at))}</td><td data-label="Model">${esc(r.model)}${r.stream ? ' <span class="muted">stream</span>' : ""}</td>
      <td data-label="Status"><span class="badge ${esc(r.status)}">${esc(r.status)}</span></td>
      <td data-label="In">${fmtInt(r.input_tokens)}${r.tokens_estimated ? "*" : ""}</td><td data-label="Out">${fmtInt(r.output_tokens)}${r.tokens_estimated ? "*" : ""}</td>
      <td data-label="TTFT">${fmtMs(r.ttft_ms)}</td><td data-label="Latency">${fmtMs(r.latency_ms)}</td><td data-label="Node" class="mono">${esc(short(r.node))}</td></tr>`).join("")
    || `<tr><td colspan="8" class="muted">No requests yet.</td></tr>`;
}
$("#usage-hours").addEventListener("change", loadUsage);

// ---- workload ---------------------------------------------------------------------------------------------
// The trace analysis of a recent window (GET /admin/workload), drawn as plain SVG like the usage chart. Reading a
// week of rows costs the frontend a moment, so the tab reloads every 30 s rather than with every refresh.
const WORKLOAD_EVERY_MS = 30000;
const workload = { window: "", loadedAt: 0 };
const NO_REQUESTS = "No completed requests in this window.";
const fmtPct = (v) => (v == null ? "-" : `${(v * 100).toFixed(v > 0 && v < 0.1 ? 1 : 0)}%`);
const fmtTok = (v) => (v == null ? "-" : v >= 1e9 ? `${(v / 1e9).toFixed(1)}G` : v >= 1e6 ? `${(v / 1e6).toFixed(1)}M`
  : v >= 1e4 ? `${Math.round(v / 1e3)}k` : fmtInt(Math.round(v)));
const fmtSec = (v) => (v == null ? "-" : fmtMs(v * 1000));
const chartWidth = (box) => Math.max(280, box.clientWidth || 440);
const clip = (text, px) => { const n = Math.max(4, Math.floor(px / 6.6)); return text.length > n ? `${text.slice(0, n - 1)}…` : text; };
const pad2 = (n) => String(n).padStart(2, "0");
function timeLabel(span) {
  return (t) => {
    const d = new Date(t * 1000);
    return span > 86400 ? `${pad2(d.getMonth() + 1)}-${pad2(d.getDate())}` : `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
  };
}
function nothing(box, text) {
  box.innerHTML = `<svg viewBox="0 0 ${chartWidth(box)} 48" role="img"><text class="empty" x="8" y="28">${esc(text)}</text></svg>`;
}
function hbars(box, items, fmt, max = null) {
  // One bar per item ({label, value, note}), labelled on the left, largest first as given.
  if (!items.length) { nothing(box, NO_REQUESTS); return; }
  const W = chartWidth(box), row = 24, L = Math.min(190, W * 0.38), R = 64, H = items.length * row + 6;
  const top = max ?? Math.max(1e-9, ...items.map((i) => i.value));
  box.innerHTML = `<svg viewBox="0 0 ${W} ${H}" role="img">${items.map((it, i) => {
    const y = 4 + i * row, w = Math.max(1, (W - L - R) * Math.min(1, it.value / top));
    const tip = `${it.label}: ${fmt(it.value)}${it.note ? ` (${it.note})` : ""}`;
    return `<g class="bar-row" data-label="${esc(it.label)}"><text class="bar-label" x="${L - 6}" y="${y + 15}" text-anchor="end">${esc(clip(it.label, L - 8))}</text>
      <rect class="bar" x="${L}" y="${y + 4}" width="${w}" height="${row - 9}" rx="2"><title>${esc(tip)}</title></rect>
      <text class="bar-value" x="${L + w + 6}" y="${y + 15}">${esc(fmt(it.value))}</text></g>`;
  }).join("")}</svg>`;
}
function lines(box, series, { xLog = false, step = false, xFmt, yFmt, yMax = null, xMin = null, xMax = null }) {
  // One polyline per series ({name, cls, points: [[x, y], ...]}), with a legend; x on a log scale when xLog; a
  // step function from 0 when step (an empirical CDF). Points are marked where a series has few of them.
  const all = series.flatMap((s) => s.points);
  if (!all.length) { nothing(box, NO_REQUESTS); return; }
  const W = chartWidth(box), H = 190, L = 48, B = 24, T = 10, R = 14;
  const fx = xLog ? (v) => Math.log10(Math.max(1, v)) : (v) => v;
  let x0 = fx(xMin ?? Math.min(...all.map((p) => p[0])));
  let x1 = fx(xMax ?? Math.max(...all.map((p) => p[0])));
  if (xLog) { x0 = Math.floor(x0); x1 = Math.max(Math.ceil(x1), x0 + 1); }
  if (x1 <= x0) x1 = x0 + 1;
  const top = yMax ?? Math.max(1e-9, ...all.map((p) => p[1]));
  const X = (v) => L + ((fx(v) - x0) / (x1 - x0)) * (W - L - R);
  const Y = (v) => H - B - (Math.min(v, top) / top) * (H - B - T);
  const yTicks = [0, 0.5, 1].map((f) => `<line class="axis" x1="${L}" x2="${W - R}" y1="${Y(top * f)}" y2="${Y(top * f)}"/>
    <text x="${L - 6}" y="${Y(top * f) + 4}" text-anchor="end">${esc(yFmt(top * f))}</text>`).join("");
  let xs;
  if (xLog) {
    xs = [];
    for (let e = x0; e <= x1; e++) xs.push(10 ** e);
  } else {
    const n = Math.max(2, Math.min(5, Math.floor(W / 120)));
    xs = Array.from({ length: n }, (_, i) => x0 + ((x1 - x0) * i) / (n - 1));
  }
  const anchor = (i) => (i === 0 ? "start" : i === xs.length - 1 ? "end" : "middle");
  const xTicks = xs.map((v, i) => `<text x="${X(v)}" y="${H - 6}" text-anchor="${anchor(i)}">${esc(xFmt(v))}</text>`).join("");
  const shape = (pts) => (step && pts.length
    ? [[pts[0][0], 0], ...pts.flatMap((p, i) => (i ? [[p[0], pts[i - 1][1]], p] : [p]))] : pts);
  const paths = series.filter((s) => s.points.length).map((s) => {
    const line = `<polyline class="line ${s.cls}" points="${shape(s.points).map((p) => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ")}"><title>${esc(s.name)}</title></polyline>`;
    const dots = !step && s.points.length <= 48
      ? s.points.map((p) => `<circle class="dot ${s.cls}" cx="${X(p[0]).toFixed(1)}" cy="${Y(p[1]).toFixed(1)}" r="3"><title>${esc(`${s.name}: ${yFmt(p[1])}`)}</title></circle>`).join("") : "";
    return line + dots;
  }).join("");
  box.innerHTML = `<svg viewBox="0 0 ${W} ${H}" role="img">${yTicks}${xTicks}${paths}</svg>
    <div class="legend">${series.map((s) => `<span><i class="${s.cls}"></i>${esc(s.name)}</span>`).join("")}</div>`;
}
function workloadMessage(text) {
  $("#workload-scope").textContent = "";
  $("#workload-stats").innerHTML = `<p class="muted needs-admin">${esc(text)}</p>`;
  $$("#view-workload .chart").forEach((c) => { c.innerHTML = ""; });
  $("#wl-latency tbody").innerHTML = "";
  $("#wl-lengths tbody").innerHTML = "";
}
async function loadWorkload(force) {
  const win = $("#workload-window").value;
  if (!force && workload.window === win && Date.now() - workload.loadedAt < WORKLOAD_EVERY_MS) return;
  if (!store.admin) {
    workload.loadedAt = 0;
    workloadMessage("The workload covers every key: unlock management in the Keys tab with the admin token to see it.");
    return;
  }
  let w;
  try {
    w = await api(`/admin/workload?window=${encodeURIComponent(win)}`, { token: store.admin });
  } catch (e) {
    workload.loadedAt = 0;
    workloadMessage(`Cannot read the workload: ${e.message}`);
    return;
  }
  workload.window = win;
  workload.loadedAt = Date.now();
  drawWorkload(w);
  $("#view-workload").dataset.window = win;
}
function drawWorkload(w) {
  const span = w.until - w.since;
  $("#workload-scope").textContent = w.truncated
    ? `newest ${fmtInt(w.analysed)} of ${fmtInt(w.totals.requests)} requests analysed` : `${fmtInt(w.analysed)} requests`;
  const top = w.ranking.models.slice(0, 5).map((m) => m.model);
  const cls = (name) => (top.includes(name) ? `s${top.indexOf(name)}` : "s5");
  const burst = w.burstiness[0];
  $("#workload-stats").innerHTML = [
    ["requests", fmtInt(w.totals.requests)], ["input tokens", fmtTok(w.totals.input_tokens)],
    ["output tokens", fmtTok(w.totals.output_tokens)], ["tokens of the top 3 models", fmtPct(w.analysed ? w.ranking.top3_share : null)],
    ["peak burstiness", burst ? `${burst.magnitude.toFixed(1)}×` : "-"], ["reusable prompt tokens", fmtPct(w.prefix_reuse.ratio)],
  ].map(([l, v]) => `<div class="stat"><div class="v">${esc(v)}</div><div class="l">${esc(l)}</div></div>`).join("");
  hbars($("#wl-ranking"), w.ranking.models.slice(0, 10).map((m) => ({
    label: m.model, value: m.tokens, note: `${fmtPct(m.share)} of all, ${fmtInt(m.requests)} requests` })), fmtTok);
  const times = timeLabel(span);
  lines($("#wl-tpm"), Object.entries(w.tpm.models).map(([name, values]) => ({
    name, cls: cls(name), points: values.map((v, i) => [w.tpm.start + i * w.tpm.bucket_s, v]) })),
  { xFmt: times, yFmt: fmtTok, xMin: w.tpm.start, xMax: w.until });
  hbars($("#wl-burst"), w.burstiness.slice(0, 10).map((b) => ({
    label: b.model, value: b.magnitude, note: `peak ${fmtInt(Math.round(b.peak_tpm))} tokens/min, mean ${fmtInt(Math.round(b.mean_tpm))} over ${b.active_minutes} active min` })),
  (v) => `${v.toFixed(1)}×`);
  $("#wl-reuse-note").textContent = w.prefix_reuse.requests
    ? `within ${Math.round(w.prefix_reuse.window_s / 60)} min, ${fmtInt(w.prefix_reuse.requests)} hashed requests` : "";
  if (w.analysed && !w.prefix_reuse.requests) nothing($("#wl-reuse"), "No request in this window has prefix hashes.");
  else hbars($("#wl-reuse"), w.prefix_reuse.models.slice(0, 10).map((r) => ({
    label: r.model, value: r.ratio, note: `${fmtInt(r.requests)} requests` })), fmtPct, 1);
  const cdf = (which) => Object.entries(w.lengths.cdf).map(([name, c]) => ({
    name: name === "all" ? "all requests" : name, cls: name === "all" ? "s5" : cls(name), points: c[which] }));
  const tokensTick = (v) => fmtTok(v);
  lines($("#wl-input-cdf"), cdf("input"), { xLog: true, step: true, xFmt: tokensTick, yFmt: fmtPct, yMax: 1 });
  lines($("#wl-output-cdf"), cdf("output"), { xLog: true, step: true, xFmt: tokensTick, yFmt: fmtPct, yMax: 1 });
  lines($("#wl-ratio"), w.output_ratio.models.map((m) => ({ name: m.model, cls: cls(m.model), points: m.points.map((p) => [p[0], p[1]]) })),
    { xFmt: times, yFmt: fmtPct, yMax: 1, xMin: w.since, xMax: w.until });
  const r = w.reasoning;
  $("#wl-latency tbody").innerHTML = [["reasoning", r.reasoning], ["non-reasoning", r.non_reasoning]].map(([kind, s]) => `
    <tr data-kind="${kind}"><td>${kind}</td><td>${fmtInt(s ? s.requests : 0)}</td><td>${fmtSec(s && s.e2e_p50)}</td><td>${fmtSec(s && s.e2e_p95)}</td>
    <td>${fmtInt(s && s.output_p50)}</td><td>${fmtInt(s && s.output_p95)}</td></tr>`).join("")
    + `<tr><td colspan="6" class="muted">${fmtInt(r.unknown)} requests without a known kind (no answer text seen, or not a chat)</td></tr>`;
  const lengthRow = (s, name) => `<tr data-model="${esc(name)}"><td data-label="Model">${esc(name)}</td><td data-label="Requests">${fmtInt(s.requests)}</td>
    <td data-label="Input">${fmtInt(s.input_p50)} / ${fmtInt(s.input_p95)} / ${fmtInt(s.input_p99)}</td>
    <td data-label="Output">${fmtInt(s.output_p50)} / ${fmtInt(s.output_p95)} / ${fmtInt(s.output_p99)}</td>
    <td data-label="1-2 tokens">${fmtPct(s.short_output_share)}</td></tr>`;
  $("#wl-lengths tbody").innerHTML = w.lengths.all
    ? [lengthRow(w.lengths.all, "all requests"), ...w.lengths.models.slice(0, 20).map((s) => lengthRow(s, s.model))].join("")
    : `<tr><td colspan="5" class="muted">${NO_REQUESTS}</td></tr>`;
}
$("#workload-window").addEventListener("change", () => loadWorkload(true));

// ---- refresh loop -----------------------------------------------------------------------------------------
async function refresh() {
  // The key field stays in view on the mesh tabs until a credential is there to read them with; the workload needs
  // the admin token, not a key.
  $(".key-panel").classList.toggle("hidden", ((current === "models" || current === "nodes") && canSeeMesh())
    || (current === "workload" && Boolean(store.admin)) || (current === "keys" && Boolean(session.me) && !store.key));
  loadHealth();
  if (current === "models" || current === "playground") await loadModels();
  if (current === "nodes") await loadNodes();
  if (current === "keys") await loadKeys();
  if (current === "usage") await loadUsage();
  if (current === "workload") await loadWorkload(false);
}
checkKey();
const firstTab = (location.hash || "").slice(1);
// Whether users can log in decides what the page offers: learn it (and who is logged in) before the first draw.
api("/api/info").then(async (i) => {
  $("#footer-info").textContent = `ingress ${i.ingress} · ${i.database}`;
  session.offered = Boolean(i.login);
  await loadSession();
}).catch(() => {}).finally(() => show(document.getElementById(`view-${firstTab}`) ? firstTab : "models"));
setInterval(() => { if (!document.hidden && current !== "keys" && !chat.busy) refresh(); }, 5000);
