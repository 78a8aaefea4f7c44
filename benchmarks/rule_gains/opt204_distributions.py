"""OPT204: a PPO minibatch update whose policy is a `Categorical` built with argument
validation (the default) vs `validate_args=False`.

The update of cleanrl's ppo.py at its CartPole size: a 4-64-64-2 actor and a 4-64-64-1
critic, minibatch 128, `Categorical(logits=...)`, `log_prob` of the taken actions, entropy,
the clipped objective, Adam. On a CPU the checks wait for nothing; the figure is what the
checks themselves cost (constraint kernels and Python). On CUDA each check also makes the
host wait for the device, which this machine cannot show.
"""

from __future__ import annotations

CODE = "OPT204:distributions"
WHAT = (
    "PPO minibatch update (4-64-64 actor and critic, batch 128, Adam), Categorical built with "
    "argument checks vs validate_args=False, CPU, 1 thread"
)


def measure(repeats: int, device: str = "cpu") -> dict:
    import statistics

    import torch

    from _timing import median_time, one_thread

    torch.manual_seed(0)

    def mlp(outputs):
        return torch.nn.Sequential(
            torch.nn.Linear(4, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, outputs),
        ).to(device)

    actor, critic = mlp(2), mlp(1)
    optimizer = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=2.5e-4)
    obs = torch.randn(128, 4, device=device)
    actions = torch.randint(0, 2, (128,), device=device)
    old_log_probs = torch.full((128,), -0.69, device=device)
    advantages = torch.randn(128, device=device)
    returns = torch.randn(128, device=device)

    def update(validate):
        def run():
            probs = torch.distributions.Categorical(logits=actor(obs), validate_args=validate)
            ratio = (probs.log_prob(actions) - old_log_probs).exp()
            clipped = torch.clamp(ratio, 0.8, 1.2)
            policy_loss = torch.max(-advantages * ratio, -advantages * clipped).mean()
            value_loss = 0.5 * (critic(obs).squeeze(1) - returns).pow(2).mean()
            loss = policy_loss - 0.01 * probs.entropy().mean() + 0.5 * value_loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        return run

    checked, unchecked = update(True), update(False)
    before, after = [], []
    with one_thread():
        for _ in range(max(1, repeats // 5)):
            before.append(median_time(checked, 50, device, warmup=5))
            after.append(median_time(unchecked, 50, device, warmup=5))
    return {"before_s": statistics.median(before), "after_s": statistics.median(after)}
