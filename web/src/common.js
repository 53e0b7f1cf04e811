// What every mcp-interp view shares: the MCP Apps protocol (view side), theming, the tooltip, colour scales.
//
// Why the protocol is written here instead of importing `App` from @modelcontextprotocol/ext-apps: that
// class bundles zod and the MCP client (about 650 KB minified), more than twice the 300 KB budget of a view,
// and a view needs four messages of it. The messages follow the specification (SEP-1865, protocol
// 2026-01-26): the `ui/initialize` request, the `ui/notifications/initialized` notification, the host's
// `ui/notifications/tool-input` / `tool-result` / `host-context-changed`, `tools/call` for clicks and `resources/read`
// for the complete result a returned one names (`result_uri`: the grids of `patch` and `patch_heads`). The
// browser tests drive every view through the official `AppBridge` of that package, which validates each
// message against its schemas.

const PROTOCOL_VERSION = "2026-01-26";

/**
 * Connect to the host. `handlers.result(structuredContent, callToolResult)` renders a tool result;
 * `handlers.input(arguments)` receives the tool's arguments (sent before the result).
 * Returns `{ callTool(name, args), complete(result) }`: a promise of the CallToolResult, and of the complete result
 * behind a returned one (`resources/read` of its `result_uri`).
 */
export function connect(name, handlers) {
  const pending = new Map();
  let nextId = 1;
  const send = (message) => window.parent.postMessage({ jsonrpc: "2.0", ...message }, "*");
  const request = (method, params) =>
    new Promise((resolve, reject) => {
      const id = nextId++;
      pending.set(id, { resolve, reject });
      send({ id, method, params });
    });

  window.addEventListener("message", (event) => {
    if (event.source !== window.parent) return;
    const message = event.data;
    if (!message || message.jsonrpc !== "2.0") return;
    if (message.id !== undefined && !message.method) {
      const waiter = pending.get(message.id);
      if (!waiter) return;
      pending.delete(message.id);
      if (message.error) waiter.reject(new Error(message.error.message || "request failed"));
      else waiter.resolve(message.result);
      return;
    }
    if (message.id !== undefined) {
      // Requests a view answers: ping, and ui/resource-teardown (nothing to release). Anything else is unknown.
      if (message.method === "ping" || message.method === "ui/resource-teardown") send({ id: message.id, result: {} });
      else send({ id: message.id, error: { code: -32601, message: `Method not found: ${message.method}` } });
      return;
    }
    const params = message.params || {};
    if (message.method === "ui/notifications/tool-input") handlers.input?.(params.arguments || {});
    else if (message.method === "ui/notifications/tool-result") showResult(handlers, params);
    else if (message.method === "ui/notifications/host-context-changed") applyHostContext(params);
    else if (message.method === "ui/notifications/tool-cancelled") showError(`The tool call was cancelled${params.reason ? `: ${params.reason}` : "."}`);
  });

  // The content's own height (the document's scrollHeight never drops below the iframe the host gave us), sent
  // only once the handshake is done.
  let initialized = false;
  const reportSize = () => {
    if (!initialized) return;
    const box = document.documentElement.getBoundingClientRect();
    send({ method: "ui/notifications/size-changed", params: { width: Math.ceil(box.width), height: Math.ceil(box.height) } });
  };

  request("ui/initialize", {
    appInfo: { name: `mcp-interp ${name}`, version: "1.0.0" },
    appCapabilities: {},
    protocolVersion: PROTOCOL_VERSION,
  })
    .then((result) => {
      applyHostContext(result?.hostContext || {});
      send({ method: "ui/notifications/initialized", params: {} });
      initialized = true;
      reportSize();
    })
    .catch((error) => showError(`The host refused to connect: ${error.message}`));

  new ResizeObserver(reportSize).observe(document.body);

  return {
    async callTool(toolName, args) {
      return request("tools/call", { name: toolName, arguments: args });
    },
    /** The complete result behind a returned one: its `result_uri` (result://…) read through the host with
     * `resources/read` (a returned `patch` or `patch_heads` result holds its top cells, the stored one the grids). */
    async complete(result) {
      if (!result.result_uri) return result;
      let read;
      try {
        read = await request("resources/read", { uri: result.result_uri });
      } catch (error) {
        throw new Error(`the grid is in ${result.result_uri}, which this host could not read (${error.message})`);
      }
      const text = read?.contents?.[0]?.text;
      if (typeof text !== "string") throw new Error(`${result.result_uri} holds no JSON text`);
      return JSON.parse(text);
    },
  };
}

async function showResult(handlers, result) {
  if (result.isError) {
    showError((result.content || []).map((block) => block.text || "").join("\n") || "The tool reported an error.");
    return;
  }
  if (!result.structuredContent) {
    showError("This result has no structured content to draw.");
    return;
  }
  try {
    await handlers.result(result.structuredContent, result);
    document.body.dataset.ready = "true";
  } catch (error) {
    showError(`Cannot draw this result: ${error.message}`);
  }
}

export function showError(text) {
  const app = document.getElementById("app");
  app.replaceChildren(el("p", { class: "error" }, text));
  document.body.dataset.ready = "error";
}

/** Light or dark from the host (`hostContext.theme`), else the system's preference; host CSS variables win. */
function applyHostContext(context) {
  const root = document.documentElement;
  if (context.theme === "light" || context.theme === "dark") {
    root.dataset.theme = context.theme;
    root.style.colorScheme = context.theme;
  }
  const variables = context.styles?.variables || {};
  for (const [name, value] of Object.entries(variables)) {
    if (name.startsWith("--") && typeof value === "string") root.style.setProperty(name, value);
  }
}

/** `el("div", {class: "x", "data-cell": "L1H2"}, child, "text", ...)` */
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "style" && typeof value === "object") Object.assign(node.style, value);
    else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const SVG = "http://www.w3.org/2000/svg";
export function svg(tag, attributes = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (value === undefined || value === null) continue;
    if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) if (child) node.append(child);
  return node;
}

/** Hovering (or focusing) any element with `data-tip` shows its text in the tooltip `#tip`. */
export function enableTooltip() {
  const tip = document.getElementById("tip");
  const show = (event) => {
    const target = event.target.closest?.("[data-tip]");
    if (!target) return;
    tip.textContent = target.getAttribute("data-tip");
    tip.hidden = false;
    const box = target.getBoundingClientRect();
    const x = Math.min(box.right + 8, window.innerWidth - tip.offsetWidth - 4);
    const y = Math.min(box.top, window.innerHeight - tip.offsetHeight - 4);
    tip.style.left = `${Math.max(4, x)}px`;
    tip.style.top = `${Math.max(4, y)}px`;
  };
  document.addEventListener("mouseover", show);
  document.addEventListener("focusin", show);
  document.addEventListener("mouseleave", () => (tip.hidden = true));
}

/** Diverging colour for v in [−span, span]: blue (negative) through the background to red (positive). */
export function diverging(value, span) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "var(--missing)";
  const t = Math.max(-1, Math.min(1, span > 0 ? value / span : 0));
  const [r, g, b] = t >= 0 ? [178, 24, 43] : [33, 102, 172];
  return `rgba(${r}, ${g}, ${b}, ${Math.abs(t).toFixed(3)})`;
}

/** Sequential colour for v in [0, max]. */
export function sequential(value, max) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "var(--missing)";
  const t = Math.max(0, Math.min(1, max > 0 ? value / max : 0));
  return `rgba(120, 60, 200, ${t.toFixed(3)})`;
}

export function spanOf(grid) {
  let span = 0;
  for (const row of grid) for (const v of row) if (v !== null && Number.isFinite(v)) span = Math.max(span, Math.abs(v));
  return span || 1;
}

export function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "n/a";
  return (value >= 0 ? "+" : "") + value.toFixed(digits);
}

/** A token as a label: quotes kept visible so leading spaces show (" John"). */
export function tokenLabel(token) {
  return JSON.stringify(token);
}

export function legend(text) {
  return el("p", { class: "legend" }, text);
}
