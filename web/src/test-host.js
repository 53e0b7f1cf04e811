// A minimal MCP Apps host for the browser tests: the official AppBridge of @modelcontextprotocol/ext-apps in
// front of a sandboxed iframe. The test page sets `window.VIEW_HTML`, `window.TOOL_ARGS`, `window.TOOL_RESULT`
// and `window.THEME`, then calls `window.startHost()`. The view's `tools/call` requests are recorded in
// `window.toolCalls` and answered from `window.TOOL_REPLIES[name]` (a CallToolResult) when given; its
// `resources/read` requests in `window.resourceReads`, answered from `window.RESOURCES[uri]` (the contents).
import { AppBridge, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";

window.toolCalls = [];
window.resourceReads = [];
window.startHost = async () => {
  const iframe = document.getElementById("view");
  const bridge = new AppBridge(
    null,
    { name: "mcp-interp-test-host", version: "0.0.1" },
    { serverTools: {}, serverResources: {}, logging: {} },
    { hostContext: { theme: window.THEME || "light" } },
  );
  bridge.oncalltool = async (params) => {
    window.toolCalls.push(params);
    const reply = (window.TOOL_REPLIES || {})[params.name];
    return reply || { content: [{ type: "text", text: "not available in the test host" }], isError: true };
  };
  bridge.onreadresource = async ({ uri }) => {
    window.resourceReads.push(uri);
    const contents = (window.RESOURCES || {})[uri];
    if (!contents) throw new Error(`${uri}: not available in the test host`);
    return { contents };
  };
  bridge.onsizechange = ({ height }) => {
    if (height) iframe.style.height = `${height}px`;
  };
  bridge.oninitialized = async () => {
    await bridge.sendToolInput({ arguments: window.TOOL_ARGS || {} });
    await bridge.sendToolResult(window.TOOL_RESULT);
    window.hostReady = true;
  };
  await bridge.connect(new PostMessageTransport(iframe.contentWindow, iframe.contentWindow));
  iframe.srcdoc = window.VIEW_HTML;
};
