// The official TypeScript SDK client against the server over stdio: every call of a plan, every stored resource
// kind read, completions. The SDK validates each structured result against the tool's outputSchema (after
// listTools), so a result its own schema rejects throws here. Prints one JSON report on stdout.
// usage: node ts_client.mjs plan.json   (plan: {command, args, env, calls: [{tool, arguments}], prompt})
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));
const transport = new StdioClientTransport({
  command: plan.command, args: plan.args, env: { ...process.env, ...plan.env }, stderr: "ignore",
});
const client = new Client({ name: "mcp-interp-ts-check", version: "1.0.0" });
await client.connect(transport);
const report = { protocol: client.getServerVersion(), capabilities: client.getServerCapabilities(), calls: [],
  reads: [], completions: {} };
const { tools } = await client.listTools();
report.tools = tools.map((t) => t.name);
const seen = { figure: null, artifact: null, job: null };
// The SDK's default request timeout is 60 s, which a circuit tool on a busy 2-core machine can exceed: the plan's
// own timeout (default 10 min), reset by each progress notification, so a working call is never cut off.
const options = { timeout: plan.timeout_ms ?? 600000, resetTimeoutOnProgress: true, onprogress: () => {} };
const call = async (tool, args) => {
  try {
    const result = await client.callTool({ name: tool, arguments: args }, undefined, options);
    const data = result.structuredContent;
    report.calls.push({ tool, ok: !result.isError, structured: data !== undefined,
      text: (result.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("").slice(0, 300) });
    const text = JSON.stringify(data ?? {});
    seen.figure ??= text.match(/figure:\/\/[0-9a-f]{32}/)?.[0] ?? null;
    seen.artifact ??= text.match(/artifact:\/\/[0-9a-f]{32}/)?.[0] ?? null;
    seen.job ??= data?.job?.job_uri ?? null;
    return data;
  } catch (e) {
    report.calls.push({ tool, ok: false, threw: `${e.constructor.name}: ${e.message}`.slice(0, 500) });
    return null;
  }
};
for (const { tool, arguments: args } of plan.calls) await call(tool, args);
// The tools that follow handles: a figure, an artifact, a background job.
await call("get_figure", { uri: seen.figure });
await call("verify_artifact", { artifact_uri: seen.artifact });
for (let i = 0; i < 600; i++) {
  const status = await call("job_status", { job: seen.job });
  if (!status || ["done", "failed", "cancelled", "lost"].includes(status.state)) break;
  report.calls.pop();  // keep one job_status entry: the last
  await new Promise((resolve) => setTimeout(resolve, 100));
}
await call("job_cancel", { job: seen.job });
await call("export_investigation", {});  // the session's calls as a rerun script (notebook://)
const { resources } = await client.listResources();
const kinds = new Map();
for (const r of resources) {
  const kind = r.uri.split("://")[0];
  if (!kinds.has(kind)) kinds.set(kind, r.uri);
}
for (const [kind, uri] of kinds) {
  try {
    const { contents } = await client.readResource({ uri });
    report.reads.push({ kind, uri, ok: true, mimeType: contents[0].mimeType, size: (contents[0].text ?? contents[0].blob).length });
  } catch (e) {
    report.reads.push({ kind, uri, ok: false, threw: e.message.slice(0, 300) });
  }
}
const templates = (await client.listResourceTemplates()).resourceTemplates.map((t) => t.uriTemplate);
report.templates = templates;
const figure = [...kinds.values()].find((u) => u.startsWith("figure://"));
report.completions.prompt = (await client.complete({
  ref: { type: "ref/prompt", name: plan.prompt.name }, argument: plan.prompt.argument })).completion.values;
if (figure) {
  report.completions.figure = (await client.complete({ ref: { type: "ref/resource", uri: "figure://{figure_id}" },
    argument: { name: "figure_id", value: figure.slice("figure://".length, "figure://".length + 3) } })).completion.values;
}
await client.close();
console.log(JSON.stringify(report));
