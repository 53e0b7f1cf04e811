// One head's attention pattern (`attention`): query × key with token labels; the head selector asks the host
// to call `attention` again for another head of the same prompt.
import { attentionMatrix } from "./attention-matrix.js";
import { connect, el, enableTooltip } from "./common.js";

let current = null;
const session = connect("attention", { result: render });
enableTooltip();

function render(result) {
  current = result;
  const app = document.getElementById("app");
  const layerInput = el("input", { type: "number", min: 0, value: result.layer, id: "layer", style: { width: "4em" } });
  const headInput = el("input", { type: "number", min: 0, value: result.head, id: "head", style: { width: "4em" } });
  const status = el("span", { class: "status", id: "status" });
  const show = el("button", { id: "show", onclick: () => switchHead(Number(layerInput.value), Number(headInput.value), status) }, "show");
  const top = (result.top_attended || [])
    .map((t) => `${JSON.stringify(t.token)}@${t.position} ${t.weight.toFixed(3)}`)
    .join(", ");
  app.replaceChildren(
    el("h1", {}, `Attention of L${result.layer}H${result.head}`),
    el("p", { class: "meta" }, `The answer position (${result.answer_position}) attends most to: ${top}`),
    el("p", {}, "layer ", layerInput, " head ", headInput, " ", show, " ", status),
    attentionMatrix(result),
  );
}

async function switchHead(layer, head, status) {
  status.textContent = `loading L${layer}H${head}…`;
  try {
    const reply = await session.callTool("attention", { prompt: current.prompt, layer, head });
    if (reply.isError || !reply.structuredContent) throw new Error((reply.content || []).map((b) => b.text).join(" "));
    render(reply.structuredContent);
  } catch (error) {
    status.textContent = error.message;
  }
}
