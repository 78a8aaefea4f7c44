import torch
opt = torch.optim.AdamW(params, lr=1e-3)
  # an indented comment before a whitespace-only last line
 
