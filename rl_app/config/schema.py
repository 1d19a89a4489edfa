"""The typed experiment schema.

Every section rejects unknown keys. Training hyperparameters that the user does
not set stay unset, so RLlib's own defaults apply (``rl_app show`` prints them).
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Activation = Literal["tanh", "relu", "swish", "silu", "elu", "linear"]


class Section(BaseModel):
    """Base for every section: unknown keys are errors, never silently ignored."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _check_schedule(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    if not points or points[0][0] != 0:
        raise ValueError("a schedule must be [[0, value], [timestep, value], ...]")
    steps = [step for step, _ in points]
    if steps != sorted(steps):
        raise ValueError("schedule timesteps must increase")
    return points


# A piecewise-linear schedule, as RLlib takes it: [[timestep, value], ...].
Schedule = Annotated[list[tuple[NonNegativeInt, float]], AfterValidator(_check_schedule)]


class EnvSection(Section):
    id: str = Field(description="Gymnasium env id (CartPole-v1) or 'package.module:Class'.")
    config: dict[str, Any] = Field(default_factory=dict, description="kwargs for the env.")

    @field_validator("id")
    @classmethod
    def _known_env(cls, env_id: str) -> str:
        from rl_app.envs import check_env_id

        check_env_id(env_id)
        return env_id


class EnvRunnersSection(Section):
    num_env_runners: NonNegativeInt | Literal["auto"] = Field(
        "auto", description="'auto': one per CPU core minus reserved_cpus."
    )
    reserved_cpus: NonNegativeInt = Field(1, description="Cores kept for driver and learner.")
    num_envs_per_env_runner: PositiveInt = 8
    rollout_fragment_length: PositiveInt | Literal["auto"] = "auto"


class LearnersSection(Section):
    num_learners: NonNegativeInt = 0
    device: Literal["auto", "cpu", "gpu"] = Field("auto", description="'auto': GPU if visible.")


class ModelSection(Section):
    """Fields of RLlib's DefaultModelConfig; unset ones keep RLlib's defaults."""

    fcnet_hiddens: list[PositiveInt] | None = None
    fcnet_activation: Activation | None = None
    fcnet_bias_initializer: str | None = None
    head_fcnet_hiddens: list[PositiveInt] | None = None
    head_fcnet_activation: Activation | None = None
    head_fcnet_bias_initializer: str | None = None
    vf_share_layers: bool | None = None
    free_log_std: bool | None = None
    fusionnet_hiddens: list[PositiveInt] | None = None
    fusionnet_activation: Activation | None = None


class TrainingSection(Section):
    """Hyperparameters common to every algorithm (RLlib's ``AlgorithmConfig.training``)."""

    lr: PositiveFloat | Schedule | None = None
    gamma: Annotated[float, Field(gt=0, le=1)] | None = None
    train_batch_size_per_learner: PositiveInt | None = None
    minibatch_size: PositiveInt | None = None
    num_epochs: PositiveInt | None = None
    grad_clip: PositiveFloat | None = None


class PPOTraining(TrainingSection):
    lambda_: Fraction | None = Field(None, alias="lambda")
    clip_param: PositiveFloat | None = None
    vf_clip_param: PositiveFloat | None = None
    vf_loss_coeff: Annotated[float, Field(ge=0)] | None = None
    entropy_coeff: Annotated[float, Field(ge=0)] | None = None
    use_kl_loss: bool | None = None
    kl_coeff: Annotated[float, Field(ge=0)] | None = None
    kl_target: PositiveFloat | None = None
    use_gae: bool | None = None


class ReplayBufferSection(Section):
    type: Literal["EpisodeReplayBuffer", "PrioritizedEpisodeReplayBuffer"] = "PrioritizedEpisodeReplayBuffer"
    capacity: PositiveInt = 50_000
    alpha: Annotated[float, Field(ge=0)] | None = Field(None, description="Prioritization.")
    beta: Annotated[float, Field(ge=0)] | None = Field(None, description="IS correction.")

    @model_validator(mode="after")
    def _priorities_only_when_prioritized(self) -> ReplayBufferSection:
        if self.type == "EpisodeReplayBuffer" and (self.alpha is not None or self.beta is not None):
            raise ValueError("alpha and beta apply only to type PrioritizedEpisodeReplayBuffer")
        return self


NStep = PositiveInt | tuple[PositiveInt, PositiveInt]


class OffPolicyTraining(TrainingSection):
    replay_buffer: ReplayBufferSection | None = None
    num_steps_sampled_before_learning_starts: NonNegativeInt | None = None
    target_network_update_freq: NonNegativeInt | None = None
    training_intensity: PositiveFloat | None = None
    n_step: NStep | None = None
    tau: Fraction | None = None


class DQNTraining(OffPolicyTraining):
    epsilon: Schedule | None = Field(None, description="[[timestep, epsilon], ...]")
    double_q: bool | None = None
    dueling: bool | None = None


class SACTraining(OffPolicyTraining):
    actor_lr: PositiveFloat | None = None
    critic_lr: PositiveFloat | None = None
    alpha_lr: PositiveFloat | None = None
    initial_alpha: PositiveFloat | None = None
    target_entropy: float | Literal["auto"] | None = None
    twin_q: bool | None = None


class StopSection(Section):
    """Training stops at the first criterion met."""

    timesteps: PositiveInt | None = Field(None, description="Env steps sampled.")
    return_: float | None = Field(None, alias="return", description="Mean episode return.")
    time_s: PositiveFloat | None = Field(None, description="Wall-clock seconds of training.")
    iterations: PositiveInt | None = None

    @model_validator(mode="after")
    def _at_least_one(self) -> StopSection:
        if all(v is None for v in (self.timesteps, self.return_, self.time_s, self.iterations)):
            raise ValueError("set at least one of timesteps, return, time_s, iterations")
        return self


class CheckpointSection(Section):
    every: PositiveInt = Field(10, description="Checkpoint every N iterations.")
    keep: PositiveInt = Field(3, description="Keep the last K checkpoints, plus the best by return.")
    replay_buffer: bool = Field(
        True, description="Save the replay buffer with each checkpoint (off-policy algorithms)."
    )


class EvaluationSection(Section):
    interval: NonNegativeInt = Field(0, description="Evaluate every N iterations; 0 = never.")
    episodes: PositiveInt = 10
    num_env_runners: NonNegativeInt = 0
    explore: bool = Field(False, description="False: deterministic (greedy) actions.")


T = TypeVar("T", bound=TrainingSection)


class Experiment(Section, Generic[T]):
    """One named experiment: what to train, on what, for how long."""

    description: str = ""
    algorithm: str
    env: EnvSection
    training: T
    model: ModelSection = Field(default_factory=ModelSection)
    env_runners: EnvRunnersSection = Field(default_factory=EnvRunnersSection)  # type: ignore[arg-type]
    learners: LearnersSection = Field(default_factory=LearnersSection)  # type: ignore[arg-type]
    stop: StopSection
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)  # type: ignore[arg-type]
    evaluation: EvaluationSection = Field(default_factory=EvaluationSection)  # type: ignore[arg-type]
    seed: NonNegativeInt | None = 0
    storage: str | None = Field(
        None, description="Mirror run folders to this local path or URI (s3://, gs://, ...)."
    )
    extends: str | None = Field(None, description="Name of an experiment this one builds on.")

    @field_validator("env", mode="before")
    @classmethod
    def _env_shorthand(cls, value: Any) -> Any:
        return {"id": value} if isinstance(value, str) else value
