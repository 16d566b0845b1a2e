// attend_inputs.glsl: where the attention shaders (attend, baseline_attend, reduce, baseline_dequant)
// read their inputs (queries, sink logits, page tables, masks, work tables). The host writes them to the
// up buffer; on a discrete GPU, where up is host memory behind PCIe, it first copies them into the
// device-local scratch buffer at word pc.in_base (INPUTS_STAGED, GPU_SPEC_OP3), so that the many
// workgroups that read the same queries and page tables (every split-K chunk) read device memory.
// Word offsets inside the inputs are the same either way. Include after common.glsl and the Push block.

layout(constant_id = 33) const uint INPUTS_STAGED = 0;

uint in_u(uint i) { return INPUTS_STAGED != 0u ? scratch[pc.in_base + i] : up[i]; }
float in_f(uint i) { return uintBitsToFloat(in_u(i)); }
