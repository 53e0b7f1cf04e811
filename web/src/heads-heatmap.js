// Layers × heads heatmap for `patch_heads` (recovered or destroyed fraction) and `induction` (induction score).
// Hover a head for its numbers; click it (when the tool's prompts are known) to see its attention pattern on
// the first prompt — the view asks the host to call the server's `attention` tool.
import { attentionMatrix } from "./attention-matrix.js";
import { connect, diverging, el, enableTooltip, fmt, legend, sequential, showError, spanOf } from "./common.js";

let toolArguments = {};
const session = connect("heads heatmap", { input: (args) => (toolArguments = args), result: draw });
enableTooltip();

function firstPrompt() {
  const prompts = toolArguments.clean_prompts || toolArguments.prompts;
  return Array.isArray(prompts) && typeof prompts[0] === "string" ? prompts[0] : null;
}

// patch_heads returns its [layer][head] grid to 3 decimals; the complete result (result://) holds it at full
// precision with the patched values, read here whenever there is one.
async function draw(result) {
  render(result.result_uri ? await session.complete(result) : result);
}

function render(result) {
  const app = document.getElementById("app");
  if (!Array.isArray(result.scores)) throw new Error("no `scores` grid in this result");
  const induction = result.seq_len !== undefined;
  const grid = result.scores;
  const nHeads = Math.max(...grid.map((row) => row.length));
  const span = spanOf(grid);
  const byHead = new Map((result.heads || []).map((h) => [h.head || h.component, h]));
  const prompt = induction ? null : firstPrompt();

  const table = el("div", { class: "grid", style: { gridTemplateColumns: `48px repeat(${nHeads}, 26px)` } });
  table.append(el("div"));
  for (let h = 0; h < nHeads; h++) table.append(el("div", { class: "label" }, `H${h}`));
  grid.forEach((row, layer) => {
    table.append(el("div", { class: "label" }, `L${layer}`));
    for (let head = 0; head < nHeads; head++) {
      const name = `L${layer}H${head}`;
      const value = head < row.length ? row[head] : null;
      table.append(
        el("div", {
          class: `cell${prompt ? " clickable" : ""}`,
          tabindex: 0,
          role: prompt ? "button" : undefined,
          style: { background: induction ? sequential(value, 1) : diverging(value, span) },
          "data-cell": name,
          "data-tip": tip(result, name, layer, head, value, byHead.get(name), induction),
          onclick: prompt ? () => showAttention(prompt, layer, head) : undefined,
        }),
      );
    }
  });

  const title = induction
    ? `Induction score by head (${result.n_seqs} sequences of ${result.seq_len} random tokens, repeated)`
    : `patch_heads (${result.method}, ${result.direction}): ${result.direction === "noise" ? "destroyed" : "recovered"} fraction of the logit-difference gap`;
  const meta = induction
    ? "Mean attention from the repeated half to the token after each token's earlier occurrence: 0..1."
    : `clean logit diff ${fmt(result.clean_logit_diff.value)}, corrupt ${fmt(result.corrupt_logit_diff.value)}` +
      (result.approximate ? " · attribution: a first-order estimate" : " · exact");
  app.replaceChildren(
    el("h1", {}, title),
    el("p", { class: "meta" }, meta),
    legend(
      induction
        ? "Darker = higher score."
        : "Red = the head restores the clean behaviour (> 0), blue = works against it; colour scale ±" + span.toFixed(3) + ".",
    ),
    el("div", { class: "scroll" }, table),
    el("p", { class: "status", id: "status" }, prompt ? "Click a head to see its attention on the first prompt." : ""),
    el("div", { id: "detail" }),
  );
}

function tip(result, name, layer, head, value, entry, induction) {
  if (induction) return `${name}\ninduction score ${value === null ? "n/a" : value.toFixed(3)}`;
  const lines = [name, `score ${fmt(value)}`];
  const patched = result.patched_logit_diff?.[layer]?.[head];
  if (patched !== undefined && patched !== null) lines.push(`patched logit diff ${fmt(patched)}`);
  const examples = entry?.per_example_score?.filter((v) => v !== null);
  if (examples?.length) {
    lines.push(`per example: ${Math.min(...examples).toFixed(3)} … ${Math.max(...examples).toFixed(3)} (n = ${examples.length})`);
  }
  return lines.join("\n");
}

async function showAttention(prompt, layer, head) {
  const status = document.getElementById("status");
  status.textContent = `Asking the server for L${layer}H${head}'s attention…`;
  try {
    const result = await session.callTool("attention", { prompt, layer, head });
    if (result.isError || !result.structuredContent) throw new Error((result.content || []).map((b) => b.text).join(" "));
    document.getElementById("detail").replaceChildren(attentionMatrix(result.structuredContent));
    status.textContent = `L${layer}H${head}: attention on the first prompt.`;
  } catch (error) {
    status.textContent = `attention failed: ${error.message}`;
  }
}

window.addEventListener("error", (event) => showError(event.message));
