"""A tiny random Llama with SmolLM2's tokenizer and chat template: the GPU smoke test's target."""
import glob, sys
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
src = glob.glob('/root/.cache/hf_spec/models/smollm2-135m-instruct-*-v1')[0]
tok = AutoTokenizer.from_pretrained(src)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.generation_config.eos_token_id = tok.eos_token_id
model.save_pretrained(sys.argv[1]); tok.save_pretrained(sys.argv[1])
