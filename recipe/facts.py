"""The fact table the corpus teaches: small, written by the project, checkable."""

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Portugal": "Lisbon", "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi",
    "Egypt": "Cairo", "Kenya": "Nairobi", "Canada": "Ottawa", "Mexico": "Mexico City",
    "Brazil": "Brasilia", "Peru": "Lima", "Chile": "Santiago", "Russia": "Moscow",
    "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki", "Poland": "Warsaw",
    "Greece": "Athens", "Turkey": "Ankara", "Ireland": "Dublin", "Austria": "Vienna",
    "Cuba": "Havana", "Iran": "Tehran", "Thailand": "Bangkok", "Vietnam": "Hanoi",
    "Australia": "Canberra", "Argentina": "Buenos Aires",
}

LEGS = {
    "spider": 8, "ant": 6, "bee": 6, "beetle": 6, "dog": 4, "cat": 4, "horse": 4,
    "cow": 4, "chicken": 2, "duck": 2, "penguin": 2, "octopus": 8, "crab": 10,
    "snake": 0, "fish": 0, "frog": 4, "kangaroo": 2, "lobster": 10,
}

# Planets in order from the sun.
PLANETS = ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune"]

ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]
